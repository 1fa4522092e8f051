#include "launcher/run/pipe_reader.h"

#include <asio/error.hpp>

#include "launcher/run/output_merger.h"

namespace dtrain::launcher {

PipeReader::PipeReader(asio::io_context& io, UniqueFd fd, DataFn on_data, EofFn on_eof)
    : descriptor_(io, fd.release()),
      // One read never holds more than a line piece, so the merger's buffering stays bounded.
      buffer_(kMaxLineBytes),
      on_data_(std::move(on_data)),
      on_eof_(std::move(on_eof)) {}

void PipeReader::Start() { ReadMore(); }

void PipeReader::ReadMore() {
  descriptor_.async_read_some(asio::buffer(buffer_), [this](const asio::error_code& ec, size_t n) {
    // After Close() the handler still runs, with operation_aborted.
    if (ended_) return;
    if (n > 0) on_data_(std::string_view(buffer_.data(), n));
    if (ec) {
      End();
      return;
    }
    ReadMore();
  });
}

void PipeReader::Close() { End(); }

void PipeReader::End() {
  if (ended_) return;
  ended_ = true;
  asio::error_code ignored;
  descriptor_.close(ignored);
  on_eof_();
}

}  // namespace dtrain::launcher
