#include "launcher/watch/cluster_tool_job.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <fstream>
#include <map>
#include <sstream>

#include "launcher/plan/cluster_tools/cluster_tool_plan.h"
#include "launcher/run/setup_command.h"
#include "launcher/watch/cluster_tool_culprit.h"
#include "launcher/watch/watch_loop.h"

namespace dtrain::launcher {
namespace {

// How often files of task output (qsub -o) are looked at; they grow on a shared file system, so
// nothing wakes us up when they do.
constexpr Duration kTailInterval{100};
// A cancel command (qdel) talks to the cluster's master; it gets this long.
constexpr Duration kCancelTimeout{15000};
// How long the first failure waits for the evidence that names its cause (cluster_tool_culprit.h):
// mpirun reports a task only after it stopped the others.
constexpr Duration kBlameWindow{3000};

// Every process on this host that descends from `root` (not `root` itself), found through
// /proc/*/stat. mpirun starts its local tasks in process groups of their own, which a signal to
// the job's group does not reach; when mpirun has to be SIGKILLed, they are killed by pid.
std::vector<pid_t> Descendants(pid_t root) {
  std::multimap<pid_t, pid_t> children;  // parent -> child
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return {};
  while (dirent* e = ::readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream fields(stat.substr(paren + 1));
    char state = 0;
    long ppid = 0;
    if (fields >> state >> ppid) children.emplace(static_cast<pid_t>(ppid), pid);
  }
  ::closedir(proc);
  std::vector<pid_t> out;
  std::vector<pid_t> todo = {root};
  while (!todo.empty()) {
    const pid_t p = todo.back();
    todo.pop_back();
    auto [begin, stop] = children.equal_range(p);
    for (auto it = begin; it != stop; ++it) {
      out.push_back(it->second);
      todo.push_back(it->second);
    }
  }
  return out;
}

struct Child : WatchedProcess {
  using WatchedProcess::WatchedProcess;

  FrontEnd* front_end = nullptr;  // null for the scheduler
  int index = 0;                  // in children_

  // The scheduler: its two streams. A front end: its own lines' two streams, then two per task.
  std::array<OutputMerger::StreamId, 2> own_streams{};
  std::vector<std::array<OutputMerger::StreamId, 2>> task_streams;
  std::vector<UniqueFd> logs;

  struct Tail {
    FrontEnd::TaskFile file;
    UniqueFd fd;
  };
  std::vector<Tail> tails;

  std::optional<NodeKey> Node() const override {
    if (front_end != nullptr) return std::nullopt;
    return NodeKey{Role::kScheduler, 0};
  }

  // "scheduler (pid 42)", "mpirun (workers, pid 43)"
  std::string Who() const override {
    const std::string pid_text = "pid " + std::to_string(pid);
    if (front_end == nullptr) return name + " (" + pid_text + ")";
    return front_end->tool + " (" + RolePlural(front_end->role) + ", " + pid_text + ")";
  }
};

class FrontEndSupervisor : public JobWatch {
 public:
  FrontEndSupervisor(FrontEndJob job, const SupervisorOptions& options)
      : JobWatch(options),
        job_(std::move(job)),
        tail_timer_(io_),
        blame_timer_(io_),
        finder_(job_.scheduler.has_value()) {}

 private:
  // --- start ---

  bool CreateProcesses() override {
    if (!CreateOutputDirectory()) return false;
    bool ok = true;
    if (job_.scheduler) {
      auto c = std::make_unique<Child>(io_);
      c->spec = *job_.scheduler;
      c->name = "scheduler";
      c->is_service = true;
      c->logs.push_back(OpenLog(job_.scheduler->LogFileName(), &ok));
      const int log = c->logs.back().get();
      c->own_streams = {merger_.AddStream("[scheduler] ", false, log),
                        merger_.AddStream("[scheduler] ", true, log)};
      Watch(c.get());
      children_.push_back(std::move(c));
    }
    for (FrontEnd& fe : job_.front_ends) {
      auto c = std::make_unique<Child>(io_);
      c->spec.argv = fe.argv;
      c->spec.env = fe.env;
      c->name = fe.Name();
      c->is_service = fe.role != Role::kWorker;
      c->front_end = &fe;
      c->index = static_cast<int>(children_.size());
      const std::string tool_name = fe.tool + "-" + RolePlural(fe.role);
      c->logs.push_back(OpenLog(tool_name + ".log", &ok));
      const std::string tool_prefix = "[" + fe.tool + " " + RolePlural(fe.role) + "] ";
      c->own_streams = {merger_.AddStream(tool_prefix, false, c->logs.back().get()),
                        merger_.AddStream(tool_prefix, true, c->logs.back().get())};
      for (int t = 0; t < fe.num_tasks; ++t) {
        ProcessSpec task;
        task.role = fe.role;
        task.rank = t;
        c->logs.push_back(OpenLog(task.LogFileName(), &ok));
        const int log = c->logs.back().get();
        const std::string prefix = "[" + task.Name() + "] ";
        c->task_streams.push_back(
            {merger_.AddStream(prefix, false, log), merger_.AddStream(prefix, true, log)});
      }
      for (const FrontEnd::TaskFile& f : fe.task_files) c->tails.push_back({f, UniqueFd()});
      Watch(c.get());
      children_.push_back(std::move(c));
    }
    return ok;
  }

  void OnStarted(WatchedProcess* p, StartedProcess started) override {
    Child* c = static_cast<Child*>(p);
    c->out = MakeReader(c, std::move(started.stdout_read), false);
    c->err = MakeReader(c, std::move(started.stderr_read), true);
  }

  void OnAllStarted() override { Tail(); }

  FrontEndParser::Sink SinkFor(Child* c) {
    FrontEndParser::Sink sink;
    sink.task_output = [this, c](int task, bool to_stderr, std::string_view bytes) {
      if (task < 0 || task >= static_cast<int>(c->task_streams.size())) {
        // A task number the tool should not have: show it rather than lose it.
        merger_.Write(c->own_streams[to_stderr], bytes);
        return;
      }
      merger_.Write(c->task_streams[task][to_stderr], bytes);
    };
    sink.tool_line = [this, c](std::string_view line, bool to_stderr) {
      std::string text(line);
      text += '\n';
      merger_.Write(c->own_streams[to_stderr], text);
      FrontEndParser& parser = *c->front_end->parser;
      const std::optional<TaskFailure> f = parser.FailureIn(line);
      if (phase() >= Phase::kStopping) return;  // what our own teardown did to the tasks
      if (f || parser.StoppingByItself()) finder_.FrontEndFailing(c->index);
      if (f) OnTaskFailure(c, *f);
    };
    sink.task_failure = [this, c](const TaskFailure& f) {
      if (phase() >= Phase::kStopping) return;
      finder_.FrontEndFailing(c->index);
      OnTaskFailure(c, f);
    };
    return sink;
  }

  std::unique_ptr<PipeReader> MakeReader(Child* c, UniqueFd fd, bool from_stderr) {
    PipeReader::DataFn on_data;
    if (c->front_end == nullptr) {
      const OutputMerger::StreamId id = c->own_streams[from_stderr];
      on_data = [this, id](std::string_view data) { merger_.Write(id, data); };
    } else {
      on_data = [this, c, from_stderr](std::string_view data) {
        c->front_end->parser->Feed(data, from_stderr, SinkFor(c));
      };
    }
    return ReadPipe(c, std::move(fd), std::move(on_data), [this, c, from_stderr] {
      if (c->front_end != nullptr) c->front_end->parser->Finish(from_stderr, SinkFor(c));
    });
  }

  // --- task output in files ---

  // Reads what the task files gained since the last look.
  void ReadTails() {
    for (auto& c : children_) {
      for (Child::Tail& t : c->tails) {
        if (t.fd.get() < 0) {
          t.fd.reset(::open(t.file.path.c_str(), O_RDONLY | O_CLOEXEC));
          if (t.fd.get() < 0) continue;  // not there yet: the task has not started
        }
        char buf[16384];
        for (;;) {
          const ssize_t n = ::read(t.fd.get(), buf, sizeof(buf));
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) break;
          if (t.file.task >= 0 && t.file.task < static_cast<int>(c->task_streams.size())) {
            merger_.Write(c->task_streams[t.file.task][t.file.to_stderr],
                          std::string_view(buf, static_cast<size_t>(n)));
          }
        }
      }
    }
  }

  void Tail() {
    ReadTails();
    bool any = false;
    for (auto& c : children_) any = any || !c->tails.empty();
    if (!any || phase() == Phase::kDone) return;
    tail_timer_.expires_after(kTailInterval);
    tail_timer_.async_wait([this](const asio::error_code& ec) {
      if (!ec) Tail();
    });
  }

  // --- naming the failure (cluster_tool_culprit.h) ---

  // The node a failure record names (the scheduler's, or an allreduce rank's).
  void OnFailureRecord(const FailureRecord& f) override {
    finder_.Blame(f);
    Decide();
  }

  void OnTaskFailure(Child* c, const TaskFailure& f) {
    finder_.TaskFailed(c->index, c->front_end->tool, c->front_end->role, f);
    Decide();
  }

  // Names the failure once the finder is sure, or once nothing more can come (every front end and
  // the scheduler reported), or when kBlameWindow has passed since the first failure.
  void Decide() {
    if (phase() >= Phase::kStopping || !finder_.AnyFailure()) return;
    if (std::optional<CulpritFinder::Verdict> v = finder_.Certain()) {
      Name(*v);
      return;
    }
    if (AllReported()) {
      Name(*finder_.Best());
      return;
    }
    if (blame_timer_armed_) return;
    blame_timer_armed_ = true;
    blame_timer_.expires_after(kBlameWindow);
    blame_timer_.async_wait([this](const asio::error_code& ec) {
      if (!ec && phase() < Phase::kStopping) Name(*finder_.Best());
    });
  }

  void Name(const CulpritFinder::Verdict& v) {
    ReadTails();  // the task's last words first
    Say(v.message + (phase() == Phase::kRunning ? "" : " after the workers finished") +
        "; stopping the job");
    set_exit_code(v.exit_code);
    BeginStop();
  }

  void OnExit(WatchedProcess* p) override {
    Child* c = static_cast<Child*>(p);
    const ExitStatus& st = c->status;
    if (!st.succeeded()) finder_.ProcessFailed(c->Who() + " " + st.Describe(), st.ShellCode());
    if (finder_.AnyFailure()) {
      Decide();
    } else if (phase() == Phase::kRunning && AllWorkersSucceeded()) {
      WaitForServices();
    } else if (phase() == Phase::kWaitingForServices && AllServicesReported()) {
      BeginStop();
    }
  }

  void OnServiceGraceOver() override {
    if (finder_.AnyFailure()) {
      Name(*finder_.Best());
      return;
    }
    JobWatch::OnServiceGraceOver();
  }

  // --- teardown ---

  void SignalStop() override {
    blame_timer_.cancel();
    // mpirun and srun stop their tasks when they get SIGTERM; qsub -sync y only stops waiting.
    // The processes are signalled one by one (nothing else of the job runs in the group here:
    // mpirun starts its local tasks in groups of their own) so that a tool already stopping by
    // itself can be left alone.
    for (auto& c : children_) {
      if (c->pid <= 0 || c->reaped) continue;
      if (c->front_end != nullptr && c->front_end->parser->StoppingByItself()) continue;
      ::kill(c->pid, SIGTERM);
    }
    RunCancelCommands();
  }

  // Blocks the event loop for at most kCancelTimeout, once, while stopping.
  void RunCancelCommands() {
    std::vector<std::vector<std::string>> commands;
    std::vector<std::string> names;
    for (auto& c : children_) {
      // A front end that ended by itself before the stop took its tasks with it.
      if (c->front_end == nullptr || c->pid == 0 || c->reported) continue;
      std::vector<std::string> cancel = c->front_end->parser->CancelCommand();
      if (cancel.empty()) continue;
      commands.push_back(std::move(cancel));
      names.push_back(c->name);
    }
    if (commands.empty()) return;
    std::vector<SetupResult> results;
    try {
      results = RunSetupCommands(commands, kCancelTimeout);
    } catch (const std::exception& e) {
      Say(std::string("warning: cannot run ") + commands[0][0] + ": " + e.what());
      return;
    }
    for (size_t i = 0; i < results.size(); ++i) {
      if (results[i].succeeded()) continue;
      std::string argv;
      for (const std::string& a : commands[i]) argv += (argv.empty() ? "" : " ") + a;
      Say("warning: `" + argv + "` for " + names[i] + " " + results[i].Describe(kCancelTimeout) +
          "; its tasks may still run");
    }
  }

  // Everything below the launcher, before the front ends die. mpirun's local tasks live in
  // process groups of their own; and when a front end has already exited, its tasks were
  // reparented to the launcher (a child subreaper), so they are found below it, not below the
  // front end.
  void BeforeKill() override {
    for (pid_t p : Descendants(::getpid())) ::kill(p, SIGKILL);
  }

  void OnFinish() override {
    ReadTails();
    tail_timer_.cancel();
    // Incomplete last lines of the tasks end here.
    for (auto& c : children_) {
      for (auto& streams : c->task_streams) {
        merger_.Close(streams[0]);
        merger_.Close(streams[1]);
      }
      merger_.Close(c->own_streams[0]);
      merger_.Close(c->own_streams[1]);
    }
  }

  FrontEndJob job_;
  asio::steady_timer tail_timer_;
  asio::steady_timer blame_timer_;
  std::vector<std::unique_ptr<Child>> children_;
  CulpritFinder finder_;
  bool blame_timer_armed_ = false;
};

}  // namespace

void LineFrontEndParser::Feed(std::string_view data, bool from_stderr, const Sink& sink) {
  splitters_[from_stderr].Append(data,
                                 [&](std::string_view line) { OnLine(line, from_stderr, sink); });
}

void LineFrontEndParser::Finish(bool from_stderr, const Sink& sink) {
  splitters_[from_stderr].Finish([&](std::string_view line) { OnLine(line, from_stderr, sink); });
}

std::string FrontEnd::Name() const { return tool + " (" + RolePlural(role) + ")"; }

int SuperviseFrontEndJob(FrontEndJob job, const SupervisorOptions& options) {
  return FrontEndSupervisor(std::move(job), options).Run();
}

}  // namespace dtrain::launcher
