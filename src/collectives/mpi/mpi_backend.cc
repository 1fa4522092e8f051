// The OpenMPI backend: MPI_COMM_WORLD as mpirun laid it out.
//
// MPI is initialised here unless the program already did (then it is also left for the program to
// finalise). The engine calls MPI from its background thread while the program's main thread
// initialised it, hence at least MPI_THREAD_SERIALIZED; MPI_THREAD_MULTIPLE where MPI offers it,
// which process sets need (each set's engine calls MPI from a thread of its own). Errors are
// returned instead of aborting (MPI_ERRORS_RETURN on our own communicator), so a broken connection
// becomes a PeerError; a rank that dies outright is normally reported by mpirun itself, which then
// ends the job.
//
// Waiting MPI calls yield the core (Open MPI's mpi_yield_when_idle, unless the user set it): each
// rank runs its training thread beside the engine's, and Open MPI's busy-polling wait, which it
// only gives up by itself on an oversubscribed node, took the core from the training. Two LeNet
// ranks on 2 cores trained ~1.5x faster with it, and a submission was no longer done before its
// caller's next line because the caller had lost its core (bench/python_bench.sh, docs/design.md).
//
// When every rank of the communicator shares one host, the collectives on host memory go through
// a shared memory segment (gloo/shm_group.h, as the Gloo backend's do; DTRAIN_GLOO_SHM=0 keeps
// them in MPI): its waits sleep on a futex, where even a yielding MPI wait keeps polling, and on
// a host with as many ranks as cores the polling took the training's CPU (LeNet over Open MPI
// trained at 0.70-0.77x PyTorch DDP on 2 cores, over Gloo's shared memory 1.14-1.26x). MPI still
// starts the job, names the ranks and reaches other hosts.
//
// Across hosts an allreduce of DTRAIN_MPI_RING_BYTES or more goes around a segmented ring of
// MPI point-to-point messages (mpi_ring.h says why: Open MPI's allreduce used half of a TCP link).
#include <mpi.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <iterator>
#include <string>

#include "collectives/backend.h"
#include "collectives/config.h"
#include "collectives/gloo/shm_group.h"
#include "collectives/mpi/mpi_ring.h"
#include "common/elementwise.h"
#include "common/logging.h"
#include "dtrain/common/error.h"

namespace dtrain::collectives {
namespace {

// MPI has no half-precision types: they travel as 2-byte integers and are reduced by these.
template <DType kType, Reduction kHow>
void ReduceHalf(void* in, void* inout, int* len, MPI_Datatype*) {
  Reduce(inout, inout, in, static_cast<size_t>(*len), kType, kHow);
}

constexpr Reduction kReductions[] = {Reduction::kSum, Reduction::kMin, Reduction::kMax,
                                     Reduction::kProduct};

template <DType kType>
MPI_User_function* HalfFunction(Reduction how) {
  switch (how) {
    case Reduction::kMin:
      return &ReduceHalf<kType, Reduction::kMin>;
    case Reduction::kMax:
      return &ReduceHalf<kType, Reduction::kMax>;
    case Reduction::kProduct:
      return &ReduceHalf<kType, Reduction::kProduct>;
    default:
      return &ReduceHalf<kType, Reduction::kSum>;
  }
}

MPI_Op BuiltInOp(Reduction how) {
  switch (how) {
    case Reduction::kMin:
      return MPI_MIN;
    case Reduction::kMax:
      return MPI_MAX;
    case Reduction::kProduct:
      return MPI_PROD;
    default:
      return MPI_SUM;
  }
}

// MPI counts are ints: a larger buffer goes in pieces of at most this many elements.
constexpr size_t kMaxCount = size_t{1} << 30;

class MpiBackend final : public Communicator {
 public:
  explicit MpiBackend(const CollectivesConfig& config)
      : shared_memory_(config.shared_memory),
        ring_bytes_(config.mpi_ring_bytes),
        timeout_(config.collective_timeout) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);  // read by MPI_Init
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        throw PeerError("MPI_Init_thread failed (is this process started by mpirun?)");
      }
      owns_mpi_ = true;
    }
    MPI_Query_thread(&thread_level_);
    if (thread_level_ < MPI_THREAD_SERIALIZED) {
      throw ConfigError("this MPI provides thread level " + std::to_string(thread_level_) +
                        " but the collectives engine needs MPI_THREAD_SERIALIZED");
    }
    Check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    Start();
  }

  std::unique_ptr<Communicator> Subset(const std::vector<int>& ranks, int generation) override {
    if (thread_level_ < MPI_THREAD_MULTIPLE) {
      throw ConfigError(
          "process sets under MPI need MPI_THREAD_MULTIPLE (each set's engine calls MPI from its "
          "own thread); this MPI was initialised with thread level " +
          std::to_string(thread_level_));
    }
    MPI_Group everyone = MPI_GROUP_NULL, members = MPI_GROUP_NULL;
    MPI_Comm_group(comm_, &everyone);
    MPI_Group_incl(everyone, static_cast<int>(ranks.size()), ranks.data(), &members);
    MPI_Comm comm = MPI_COMM_NULL;
    const int code = MPI_Comm_create_group(comm_, members, generation, &comm);
    MPI_Group_free(&members);
    MPI_Group_free(&everyone);
    Check(code, "MPI_Comm_create_group");
    return std::unique_ptr<Communicator>(
        new MpiBackend(comm, thread_level_, shared_memory_, ring_bytes_, timeout_));
  }

 private:
  // A process set's communicator, made by Subset.
  MpiBackend(MPI_Comm comm, int thread_level, bool shared_memory, size_t ring_bytes,
             Duration timeout)
      : shared_memory_(shared_memory),
        ring_bytes_(ring_bytes),
        timeout_(timeout),
        thread_level_(thread_level),
        comm_(comm) {
    Start();
  }

  void Start() {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm local;
    Check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
          "MPI_Comm_split_type");
    MPI_Comm_rank(local, &local_rank_);
    MPI_Comm_size(local, &local_size_);
    MPI_Comm_free(&local);
    for (Reduction how : kReductions) {
      const auto i = static_cast<size_t>(how);
      MPI_Op_create(HalfFunction<DType::kFloat16>(how), /*commute=*/1, &float16_ops_[i]);
      MPI_Op_create(HalfFunction<DType::kBFloat16>(how), /*commute=*/1, &bfloat16_ops_[i]);
    }
    DTRAIN_LOG(kConnections) << "collectives: MPI rank " << rank_ << " of " << size_ << " (local "
                             << local_rank_ << " of " << local_size_ << ")";
    if (size_ > 1) SetUpSharedMemory();
    if (size_ > 1 && !shm_ && ring_bytes_ > 0) {
      DTRAIN_LOG(kConnections) << "collectives: rank " << rank_ << " sends allreduces of "
                               << ring_bytes_ << " bytes or more around dtrain's ring over MPI";
    }
  }

  // Whether every rank wants the segment (DTRAIN_GLOO_SHM), shares this host and this pid
  // namespace (the segment's waits check the peers' pids). Every rank makes the same MPI call
  // whatever its own answer, so that differing settings cannot leave the collectives unpaired.
  bool EveryRankCanShare() {
    struct stat ns {};
    const long long mine_ns = ::stat("/proc/self/ns/pid", &ns) == 0 ? ns.st_ino : 0;
    long long mine[3] = {shared_memory_ && local_size_ == size_ ? 1 : 0, mine_ns, -mine_ns};
    long long least[3] = {};
    Check(MPI_Allreduce(mine, least, 3, MPI_LONG_LONG, MPI_MIN, comm_), "MPI_Allreduce");
    return least[0] == 1 && least[1] == -least[2];  // the smallest namespace is also the largest
  }

  // Rank 0 makes the segment and broadcasts its name; every rank maps it, and only if every rank
  // could do they all use it (one that could not is logged and the job stays on MPI).
  void SetUpSharedMemory() {
    if (!EveryRankCanShare()) {
      DTRAIN_LOG(kConnections) << "collectives: MPI without shared memory (DTRAIN_GLOO_SHM=0 on "
                                  "some rank, or ranks on other hosts or pid namespaces)";
      return;
    }
    ShmGroupOptions options;
    options.rank = rank_;
    options.size = size_;
    options.timeout = timeout_;
    options.describe_rank = [](int r) { return "rank " + std::to_string(r); };
    options.explain_loss = [](int r) {
      return "rank " + std::to_string(r) + " left the job (its process ended)";
    };
    options.lost_ranks = [] { return std::string(); };
    std::unique_ptr<ShmGroup> group;
    std::string why_not;
    char name[256] = {};
    try {
      if (rank_ == 0) {
        group = ShmGroup::Create(options);
        group->name().copy(name, sizeof name - 1);
      }
    } catch (const std::exception& e) {
      why_not = e.what();
    }
    Check(MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm_), "MPI_Bcast");
    try {
      if (rank_ != 0 && name[0] != '\0') group = ShmGroup::Attach(name, options);
    } catch (const std::exception& e) {
      why_not = e.what();
    }
    int mine = group ? 1 : 0, everyone = 0;
    Check(MPI_Allreduce(&mine, &everyone, 1, MPI_INT, MPI_MIN, comm_), "MPI_Allreduce");
    if (everyone == 0) {
      DTRAIN_LOG(kWarning) << "collectives: rank " << rank_
                           << " exchanges with the ranks of its host through MPI, not shared "
                              "memory: "
                           << (why_not.empty() ? std::string("another rank could not map it")
                                               : why_not);
      return;
    }
    group->Unlink();  // every rank has it mapped
    shm_ = std::move(group);
    DTRAIN_LOG(kConnections) << "collectives: rank " << rank_
                             << " uses shared memory with its host's " << size_ << " ranks";
  }

 public:
  ~MpiBackend() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // After a failure the other ranks may be gone, and MPI_Finalize would wait for them forever;
    // the process exits without it (mpirun reports that, which is right for a failed job).
    if (broken_) return;
    for (size_t i = 0; i < std::size(kReductions); ++i) {
      MPI_Op_free(&float16_ops_[i]);
      MPI_Op_free(&bfloat16_ops_[i]);
    }
    MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }

  BackendKind kind() const override { return BackendKind::kMpi; }
  // One host: the shared memory segment's futex. Across hosts: MPI's yielding poll.
  bool WaitsSleep() const override { return shm_ != nullptr; }

 protected:
  void DoAllreduce(const void* in, void* out, size_t count, DType dtype, Reduction how) override {
    if (shm_) return Shared([&] { shm_->Allreduce(in, out, count, dtype, how); });
    const size_t element = DTypeSize(dtype);
    if (ring_bytes_ > 0 && size_ > 1 && count * element >= ring_bytes_) {
      if (in != out) std::memcpy(out, in, count * element);
      MpiRingAllreduce(comm_, out, count, dtype, how, MpiRingOptions{}, &ring_scratch_,
                       [this](int code, const char* call) { Check(code, call); });
      return;
    }
    MPI_Datatype type = MPI_FLOAT;
    MPI_Op op = BuiltInOp(how);
    switch (dtype) {
      case DType::kFloat32:
        break;
      case DType::kFloat64:
        type = MPI_DOUBLE;
        break;
      case DType::kFloat16:
        type = MPI_UINT16_T;
        op = float16_ops_[static_cast<size_t>(how)];
        break;
      case DType::kBFloat16:
        type = MPI_UINT16_T;
        op = bfloat16_ops_[static_cast<size_t>(how)];
        break;
    }
    for (size_t done = 0; done < count;) {
      const size_t n = std::min(count - done, kMaxCount);
      char* o = static_cast<char*>(out) + done * element;
      const void* send = in == out ? MPI_IN_PLACE : static_cast<const char*>(in) + done * element;
      Check(MPI_Allreduce(send, o, static_cast<int>(n), type, op, comm_), "MPI_Allreduce");
      done += n;
    }
  }

  bool DoAllreducePieces(std::span<const AllreducePiece> pieces, DType dtype, Reduction how,
                         double scale) override {
    if (!shm_) return false;
    Shared([&] { shm_->AllreducePieces(pieces, dtype, how, scale); });
    return true;
  }

  void DoAllgatherv(const void* in, void* out, const std::vector<size_t>& bytes) override {
    if (shm_) return Shared([&] { shm_->Allgatherv(in, out, bytes); });
    std::vector<int> counts, offsets;
    IntLayout(bytes, &counts, &offsets, "allgather");
    Check(MPI_Allgatherv(in, counts[rank_], MPI_BYTE, out, counts.data(), offsets.data(), MPI_BYTE,
                         comm_),
          "MPI_Allgatherv");
  }

  void DoBroadcast(void* data, size_t bytes, int root) override {
    if (shm_) return Shared([&] { shm_->Broadcast(data, bytes, root); });
    for (size_t done = 0; done < bytes;) {
      const size_t n = std::min(bytes - done, kMaxCount);
      Check(MPI_Bcast(static_cast<char*>(data) + done, static_cast<int>(n), MPI_BYTE, root, comm_),
            "MPI_Bcast");
      done += n;
    }
  }

  void DoAlltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes) override {
    if (shm_) return Shared([&] { shm_->Alltoallv(in, send_bytes, out, recv_bytes); });
    std::vector<int> send_counts, send_offsets, recv_counts, recv_offsets;
    IntLayout(send_bytes, &send_counts, &send_offsets, "alltoall");
    IntLayout(recv_bytes, &recv_counts, &recv_offsets, "alltoall");
    Check(MPI_Alltoallv(in, send_counts.data(), send_offsets.data(), MPI_BYTE, out,
                        recv_counts.data(), recv_offsets.data(), MPI_BYTE, comm_),
          "MPI_Alltoallv");
  }

  void DoBarrier() override {
    if (shm_) return Shared([&] { shm_->Barrier(); });
    Check(MPI_Barrier(comm_), "MPI_Barrier");
  }

 private:
  // A collective through the segment. After its failure (a peer gone, a timeout) the others must
  // not wait for this rank there, nor may MPI_Finalize wait for the peers.
  template <typename Call>
  void Shared(Call call) {
    try {
      call();
    } catch (const std::exception& e) {
      broken_ = true;
      shm_->Abandon(e.what());
      throw;
    }
  }

  void Check(int code, const char* call) {
    if (code == MPI_SUCCESS) return;
    broken_ = true;
    char text[MPI_MAX_ERROR_STRING] = {};
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw PeerError(std::string(call) + " failed on rank " + std::to_string(rank_) + ": " +
                    std::string(text, static_cast<size_t>(std::max(length, 0))) +
                    " (another rank died or the connection broke)");
  }

  // Blocks of `bytes` one after the other as MPI's int counts and offsets.
  static void IntLayout(const std::vector<size_t>& bytes, std::vector<int>* counts,
                        std::vector<int>* offsets, const char* what) {
    size_t offset = 0;
    for (size_t b : bytes) {
      if (b > INT_MAX || offset > INT_MAX) {
        throw InvalidArgument(std::string("an MPI ") + what +
                              " moves at most 2 GiB each way; this one moves more");
      }
      counts->push_back(static_cast<int>(b));
      offsets->push_back(static_cast<int>(offset));
      offset += b;
    }
  }

  const bool shared_memory_;  // DTRAIN_GLOO_SHM
  const size_t ring_bytes_;   // DTRAIN_MPI_RING_BYTES
  std::vector<char> ring_scratch_;
  const Duration timeout_;  // of one collective through the segment
  std::unique_ptr<ShmGroup> shm_;
  bool owns_mpi_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
  bool broken_ = false;
  MPI_Comm comm_ = MPI_COMM_NULL;
  // Indexed by Reduction.
  MPI_Op float16_ops_[std::size(kReductions)] = {};
  MPI_Op bfloat16_ops_[std::size(kReductions)] = {};
};

}  // namespace

std::unique_ptr<Communicator> CreateMpiBackend(const CollectivesConfig& config) {
  return std::make_unique<MpiBackend>(config);
}

}  // namespace dtrain::collectives
