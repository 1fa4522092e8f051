#include "auth/job_auth.h"

#include <gtest/gtest.h>

#include <set>

namespace dtrain::auth {
namespace {

TEST(JobAuth, NoncesAreFreshHexOf32Bytes) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string n = NewNonce();
    EXPECT_EQ(n.size(), 64u);
    EXPECT_EQ(n.find_first_not_of("0123456789abcdef"), std::string::npos) << n;
    seen.insert(n);
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(JobAuth, ProofIsHmacSha256OfTheLabelAndParts) {
  // The reference: printf 'what do ya want \nfor nothing?\n' | openssl dgst -sha256 -hmac Jefe
  EXPECT_EQ(Proof("Jefe", "what do ya want ", {"for nothing?"}),
            "6310a198f22b1fc5020d832b4bfa76827ff6a02dcde91b20c60297b7a6b3c163");
  // The text is label\npart\n: a label holding the whole message with no parts differs.
  EXPECT_NE(Proof("Jefe", "what do ya want for nothing?", {}), Proof("Jefe", "what", {"do"}));
  EXPECT_EQ(Proof("key", "", {}).size(), 64u);
}

TEST(JobAuth, ProofDependsOnEveryInput) {
  const std::string base = Proof("a-secret-of-16+ch", "dtrain-acceptor", {"n1", "n2"});
  EXPECT_NE(base, Proof("a-secret-of-16+cH", "dtrain-acceptor", {"n1", "n2"}));
  EXPECT_NE(base, Proof("a-secret-of-16+ch", "dtrain-connector", {"n1", "n2"}));
  EXPECT_NE(base, Proof("a-secret-of-16+ch", "dtrain-acceptor", {"n2", "n1"}));
  EXPECT_NE(base, Proof("a-secret-of-16+ch", "dtrain-acceptor", {"n1", "n2", ""}));
  // Parts are delimited: moving a character across the boundary changes the proof.
  EXPECT_NE(base, Proof("a-secret-of-16+ch", "dtrain-acceptor", {"n1n", "2"}));
}

TEST(JobAuth, ProofsCompareOnlyWhenEqualAndNonEmpty) {
  const std::string p = Proof("s", "l", {"x"});
  EXPECT_TRUE(ProofsEqual(p, p));
  EXPECT_FALSE(ProofsEqual(p, p.substr(1)));
  std::string flipped = p;
  flipped.back() = flipped.back() == '0' ? '1' : '0';
  EXPECT_FALSE(ProofsEqual(p, flipped));
  EXPECT_FALSE(ProofsEqual("", ""));
}

TEST(JobAuth, WordValueFindsWholeWordsOnly) {
  const std::string text = "dtrain-challenge 1 nonce=abc proof=def xnonce=zzz";
  EXPECT_EQ(WordValue(text, "nonce"), "abc");
  EXPECT_EQ(WordValue(text, "proof"), "def");
  EXPECT_EQ(WordValue(text, "xnonce"), "zzz");
  EXPECT_EQ(WordValue(text, "refused"), "");
  EXPECT_EQ(WordValue("nonce=", "nonce"), "");
  EXPECT_EQ(WordValue("", "nonce"), "");
}

}  // namespace
}  // namespace dtrain::auth
