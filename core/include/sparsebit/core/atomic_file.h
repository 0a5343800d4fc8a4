#pragma once
// Writes a file atomically: content goes to a temporary file in the target's folder, which is
// renamed over the target on commit() and removed if the writer is destroyed uncommitted, so a
// failed run never leaves a half-written output.

#include <string>

#include "sparsebit/sdk/export.h"

namespace sparsebit {

class SPARSEBIT_API AtomicFile {
 public:
  /// Creates the temporary file now, so an unwritable destination fails before any work.
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const std::string& bytes);
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace sparsebit
