// The idx format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/): a big-endian
// magic number 0x0000TTDD (TT = 0x08 for unsigned bytes, DD = number of dimensions), DD big-endian
// uint32 sizes, then the bytes in row-major order. Read through zlib, which also reads an
// uncompressed file transparently.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/common/error.h"
#include "train/data/formats.h"

namespace dtrain::train::data_internal {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions (N, rows, cols)
constexpr uint32_t kLabelsMagic = 0x00000801;  // unsigned bytes, 1 dimension (N)
constexpr int64_t kRows = 28;
constexpr int64_t kCols = 28;
constexpr int64_t kNumClasses = 10;
// The largest payload an idx file may claim: 20 times MNIST's training images. Checked before
// anything is allocated, so a corrupt header cannot make us reserve terabytes, and a gzip bomb
// cannot make us inflate more than this.
constexpr int64_t kMaxPayloadBytes = int64_t{1} << 30;
constexpr int64_t kReadChunk = int64_t{16} << 20;

struct IdxFile {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;
};

struct GzCloser {
  void operator()(gzFile_s* f) const { gzclose(f); }
};

std::string Hex32(uint32_t v) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", v);
  return text;
}

// Reads one idx file of unsigned bytes whose magic must be `magic`. `label` ("fashion-mnist") and
// the path prefix every error message.
class IdxFileReader {
 public:
  IdxFileReader(std::string label, std::string path)
      : label_(std::move(label)), path_(std::move(path)) {}

  IdxFile Read(uint32_t magic) {
    errno = 0;
    file_.reset(gzopen(path_.c_str(), "rb"));
    if (!file_) {
      Fail(std::string("cannot open: ") + (errno != 0 ? std::strerror(errno) : "out of memory"));
    }
    gzbuffer(file_.get(), 1 << 18);

    uint8_t header[4];
    if (ReadUpTo(header, sizeof header) < 4) Fail("truncated: too short for an idx header");
    const bool named_gz = path_.size() > 3 && path_.compare(path_.size() - 3, 3, ".gz") == 0;
    if (named_gz && gzdirect(file_.get())) {
      Fail("not a gzip file (the name ends in .gz but the file has no gzip header)");
    }
    const uint32_t got = BigEndian(header);
    if (got != magic) {
      Fail("bad magic number " + Hex32(got) + ", expected " + Hex32(magic) + " (" +
           (magic == kImagesMagic ? "idx3 unsigned-byte images" : "idx1 unsigned-byte labels") +
           "); not an idx file of this kind");
    }

    IdxFile out;
    const int ndims = header[3];
    int64_t payload = 1;
    for (int d = 0; d < ndims; ++d) {
      uint8_t size[4];
      if (ReadUpTo(size, sizeof size) < 4) Fail("truncated: the header ends inside the sizes");
      const int64_t dim = BigEndian(size);
      out.dims.push_back(dim);
      // dim < 2^32 and payload <= 2^30 before the multiplication: no overflow.
      payload *= dim;
      if (payload > kMaxPayloadBytes) {
        Fail("header claims sizes " + DimsText(out.dims) + "... of more than " +
             std::to_string(kMaxPayloadBytes) +
             " bytes, the limit for an idx file; corrupt header?");
      }
    }
    if (out.dims[0] == 0) Fail("holds no items (the first size is 0)");

    // Grow with the data really read, not with the header's claim.
    out.bytes.reserve(static_cast<size_t>(std::min(payload, kReadChunk * 4)));
    int64_t have = 0;
    while (have < payload) {
      const int64_t want = std::min(payload - have, kReadChunk);
      out.bytes.resize(static_cast<size_t>(have + want));
      const int64_t got_now = ReadUpTo(out.bytes.data() + have, want);
      have += got_now;
      if (got_now < want) {
        Fail("truncated: header says " + DimsText(out.dims) + " (" + std::to_string(payload) +
             " data bytes) but the file holds only " + std::to_string(have) + " after the header");
      }
    }
    uint8_t extra;
    if (ReadUpTo(&extra, 1) != 0) {
      Fail("oversized: data continues past the " + std::to_string(payload) +
           " bytes that the header's sizes " + DimsText(out.dims) + " describe");
    }
    file_.reset();
    return out;
  }

  [[noreturn]] void Fail(const std::string& problem) const {
    throw Error(label_ + ": " + path_ + ": " + problem);
  }

 private:
  static uint32_t BigEndian(const uint8_t* b) {
    return uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | uint32_t{b[3]};
  }

  static std::string DimsText(const std::vector<int64_t>& dims) {
    std::string text;
    for (size_t i = 0; i < dims.size(); ++i) {
      if (i > 0) text += 'x';
      text += std::to_string(dims[i]);
    }
    return text;
  }

  // Reads up to n bytes (n < 2^31); fewer only at the end of the data. Throws on a read error,
  // corrupt compressed data or a compressed stream cut short.
  int64_t ReadUpTo(uint8_t* dst, int64_t n) {
    int64_t total = 0;
    while (total < n) {
      const int got = gzread(file_.get(), dst + total, static_cast<unsigned>(n - total));
      CheckStream();
      if (got <= 0) break;
      total += got;
    }
    return total;
  }

  void CheckStream() const {
    int err = Z_OK;
    const char* message = gzerror(file_.get(), &err);
    if (err == Z_OK) return;
    if (err == Z_ERRNO) Fail(std::string("read error: ") + std::strerror(errno));
    // zlib reports a compressed stream that stops before its end as Z_BUF_ERROR.
    if (err == Z_BUF_ERROR) Fail("truncated gzip data (the compressed stream ends early)");
    Fail(std::string("corrupt gzip data: ") + (message ? message : "unknown zlib error"));
  }

  std::string label_;
  std::string path_;
  std::unique_ptr<gzFile_s, GzCloser> file_;
};

// `dir`/`stem`.gz, or `dir`/`stem` when only the uncompressed file is there.
std::string FindIdxFile(const IdxDatasetInfo& info, const std::string& dir,
                        const std::string& stem) {
  namespace fs = std::filesystem;
  const fs::path gz = fs::path(dir) / (stem + ".gz");
  const fs::path raw = fs::path(dir) / stem;
  std::error_code ec;
  if (fs::is_regular_file(gz, ec)) return gz.string();
  if (fs::is_regular_file(raw, ec)) return raw.string();
  throw Error(info.name + ": " + gz.string() + " not found (nor " + raw.filename().string() +
              "); " + info.get_hint);
}

}  // namespace

ImageDataset LoadIdxDataset(const IdxDatasetInfo& info, const std::string& dir, Split split) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw Error(info.name + ": data directory '" + dir + "' does not exist; " + info.get_hint);
  }
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_path = FindIdxFile(info, dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = FindIdxFile(info, dir, prefix + "-labels-idx1-ubyte");

  IdxFileReader images_reader(info.name, images_path);
  IdxFile images = images_reader.Read(kImagesMagic);
  if (images.dims[1] != kRows || images.dims[2] != kCols) {
    images_reader.Fail("images are " + std::to_string(images.dims[1]) + "x" +
                       std::to_string(images.dims[2]) + ", expected " + std::to_string(kRows) +
                       "x" + std::to_string(kCols));
  }
  IdxFileReader labels_reader(info.name, labels_path);
  IdxFile labels = labels_reader.Read(kLabelsMagic);
  const int64_t n = images.dims[0];
  if (labels.dims[0] != n) {
    labels_reader.Fail("holds " + std::to_string(labels.dims[0]) + " labels but " + images_path +
                       " holds " + std::to_string(n) + " images");
  }
  const auto bad = std::find_if(labels.bytes.begin(), labels.bytes.end(),
                                [](uint8_t label) { return label >= kNumClasses; });
  if (bad != labels.bytes.end()) {
    labels_reader.Fail("label " + std::to_string(*bad) + " at index " +
                       std::to_string(bad - labels.bytes.begin()) + " is out of range [0, " +
                       std::to_string(kNumClasses) + ")");
  }

  // One conversion to float, then the affine map (x / 255 - mean) / std in place.
  const auto u8 = torch::TensorOptions().dtype(torch::kUInt8);
  ImageDataset out;
  out.images = torch::from_blob(images.bytes.data(), {n, 1, kRows, kCols}, u8).to(torch::kFloat32);
  out.images.mul_(1.0 / (255.0 * info.stats.std)).sub_(info.stats.mean / info.stats.std);
  out.labels = torch::from_blob(labels.bytes.data(), {n}, u8).to(torch::kInt64);
  out.num_classes = kNumClasses;
  return out;
}

}  // namespace dtrain::train::data_internal
