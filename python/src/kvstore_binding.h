// The KVStore as the extension holds it: shared with the trainers made over it, so that closing
// the Python object while a trainer still uses the store keeps it alive until the trainer closes.
#pragma once

#include <memory>

#include "dtrain/kvstore/kvstore.h"

namespace dtrain::python {

class KVStoreHandle {
 public:
  explicit KVStoreHandle(const std::string& type);
  // Leaves the job (dist stores) once no trainer uses the store any more.
  ~KVStoreHandle() { Close(); }

  // Throws InvalidArgument after Close.
  const std::shared_ptr<KVStore>& store() const;
  void Close();

 private:
  std::shared_ptr<KVStore> store_;
};

}  // namespace dtrain::python
