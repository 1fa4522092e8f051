// Reading one child's output pipe on the launcher's event loop.
//
// Threads: all calls and all callbacks happen on the thread that runs the io_context; the reader
// must outlive the io_context's run() (callbacks capture `this`).
// Ownership: the reader owns the pipe's read end and closes it on Close() or destruction.
// Failure: a read error counts as the end of the stream (on_eof), like EOF.
#pragma once

#include <asio/io_context.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <functional>
#include <string_view>
#include <vector>

#include "launcher/run/process_group.h"

namespace dtrain::launcher {

class PipeReader {
 public:
  using DataFn = std::function<void(std::string_view data)>;
  using EofFn = std::function<void()>;

  PipeReader(asio::io_context& io, UniqueFd fd, DataFn on_data, EofFn on_eof);
  PipeReader(const PipeReader&) = delete;
  PipeReader& operator=(const PipeReader&) = delete;

  // Starts the read loop; on_data for every piece read, then on_eof exactly once.
  void Start();

  // Stops reading now (e.g. a grandchild that escaped the job still holds the pipe open) and
  // calls on_eof if it was not called yet.
  void Close();

  bool open() const { return !ended_; }

 private:
  void ReadMore();
  void End();

  asio::posix::stream_descriptor descriptor_;
  std::vector<char> buffer_;
  DataFn on_data_;
  EofFn on_eof_;
  bool ended_ = false;
};

}  // namespace dtrain::launcher
