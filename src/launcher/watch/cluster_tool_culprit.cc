#include "launcher/watch/cluster_tool_culprit.h"

namespace dtrain::launcher {

void CulpritFinder::Blame(const FailureRecord& failure) {
  if (!blame_) blame_ = failure;  // the first one is the cause
}

void CulpritFinder::FrontEndFailing(int front_end) {
  if (!first_failing_) first_failing_ = front_end;
}

void CulpritFinder::TaskFailed(int front_end, const std::string& tool, Role role,
                               const TaskFailure& failure) {
  FrontEndFailing(front_end);
  ProcessSpec task;
  task.role = role;
  task.rank = failure.task;
  reports_.push_back({front_end, role, failure,
                      task.Name() + " " + failure.description + " (reported by " + tool + ")"});
}

void CulpritFinder::ProcessFailed(const std::string& message, int exit_code) {
  if (!process_failure_) process_failure_ = Verdict{message, exit_code};
}

bool CulpritFinder::AnyFailure() const { return blame_ || !reports_.empty() || process_failure_; }

const CulpritFinder::Report* CulpritFinder::ReportOn(Role role, int rank) const {
  for (const Report& r : reports_) {
    if (r.role == role && r.failure.task == rank) return &r;
  }
  return nullptr;
}

const CulpritFinder::Report* CulpritFinder::FirstReportOf(int front_end) const {
  for (const Report& r : reports_) {
    if (r.front_end == front_end) return &r;
  }
  return nullptr;
}

std::optional<CulpritFinder::Verdict> CulpritFinder::Certain() const {
  if (blame_) {
    if (const Report* r = ReportOn(blame_->node.role, blame_->node.rank)) {
      return Verdict{r->message, r->failure.exit_code};
    }
    return std::nullopt;  // its exit code may still come
  }
  if (has_scheduler_ || !first_failing_) return std::nullopt;
  if (const Report* r = FirstReportOf(*first_failing_)) {
    return Verdict{r->message, r->failure.exit_code};
  }
  return std::nullopt;
}

std::optional<CulpritFinder::Verdict> CulpritFinder::Best() const {
  if (std::optional<Verdict> v = Certain()) return v;
  if (blame_) {
    // Its own exit code is unknown: the job's first reported one stands in.
    int code = 1;
    if (!reports_.empty()) {
      code = reports_.front().failure.exit_code;
    } else if (process_failure_) {
      code = process_failure_->exit_code;
    }
    return Verdict{blame_->Text(), code};
  }
  if (first_failing_) {
    if (const Report* r = FirstReportOf(*first_failing_)) {
      return Verdict{r->message, r->failure.exit_code};
    }
  }
  if (!reports_.empty())
    return Verdict{reports_.front().message, reports_.front().failure.exit_code};
  return process_failure_;
}

}  // namespace dtrain::launcher
