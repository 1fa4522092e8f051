// Horovod's process sets: subsets of the job's ranks that run collectives among themselves.
//
// Each set a rank belongs to has an Engine of its own (negotiation, fusion, background thread)
// over a Communicator of its own (Communicator::Subset: a gloo context or an MPI communicator among
// the members), so collectives on different sets run concurrently and a name means one collective
// per set. Set 0 is the whole job, run by the job's engine; it is not in this table.
//
// Adding and removing sets are collectives of the whole job, as Horovod's are: every rank calls
// them in the same order with the same arguments. The ranks first agree over the job's engine (one
// allgather of what each asked for), so a rank that asked for something else makes every rank
// fail the same way instead of leaving the members connecting to a set that some never join.
// Every rank then knows every set (ids and members), and the members connect theirs.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "collectives/backend.h"
#include "collectives/config.h"
#include "collectives/engine/engine.h"

namespace dtrain::collectives {

class ProcessSetTable {
 public:
  // `world`: the job's engine, over `world_backend`; `config` is what each set's engine runs with
  // (CUDA arrays are staged through host memory in a set: its engine has no NCCL).
  ProcessSetTable(std::shared_ptr<Engine> world, std::shared_ptr<Communicator> world_backend,
                  CollectivesConfig config);

  // The new set's id (the smallest one free, from 1), the same on every rank. `ranks` need not be
  // sorted. InvalidArgument, on every rank, when the ranks asked for different sets, when a rank
  // is not one of the job's or is named twice, when the set is empty or a set of these ranks
  // exists (the whole job is set 0).
  int Add(std::vector<int> ranks);
  // Whether set `id` existed (set 0 is never removed). Its members stop its engine (a collective
  // among them). InvalidArgument, on every rank, when the ranks asked for different ids.
  bool Remove(int id);

  // The engine of set `id` (0: the job's). InvalidArgument when there is no such set or this rank
  // is not one of its members.
  std::shared_ptr<Engine> EngineOf(int id) const;
  // The members of set `id` as ranks of the job, ascending. InvalidArgument when there is none.
  std::vector<int> Ranks(int id) const;
  // Every set's id, 0 first.
  std::vector<int> Ids() const;

  // Stops the engines of this rank's sets (each a collective among its members); the table is then
  // empty. Called before the job's engine stops.
  void ShutdownAll();

 private:
  struct Set {
    std::vector<int> ranks;
    std::shared_ptr<Engine> engine;  // null where this rank is not a member
  };

  // Returns once every rank has asked for `request` (this rank's numbers); InvalidArgument
  // describing each rank's request when they differ.
  void Agree(const char* what, const std::vector<float>& request);

  const std::shared_ptr<Engine> world_;
  const std::shared_ptr<Communicator> world_backend_;
  CollectivesConfig config_;  // the sets' engines': no NCCL

  std::mutex change_mutex_;  // one Add or Remove at a time, as every rank makes them in order
  int changes_ = 0;          // Add and Remove calls so far: names their agreement
  // Sets added so far: keeps their rendezvous apart. Below kCrossHostGenerations
  // (nccl/hierarchy.h), which the hierarchical NCCL allreduce uses.
  int generation_ = 0;

  mutable std::mutex mutex_;  // guards sets_
  std::map<int, Set> sets_;
};

}  // namespace dtrain::collectives
