#pragma once
// Writes a file atomically: content goes to a temporary file in the target's folder, which is
// renamed over the target on commit() and removed if the writer is destroyed uncommitted, so a
// failed run never leaves a half-written output.
//
// Note [Interrupted runs]
// The temporary file is created at the first write(), not when the writer is made, so during the
// long steps of a run (calibration, training) no temporary exists. Every live temporary is also
// listed where a signal handler can reach it: install_interrupt_cleanup() makes SIGINT, SIGTERM
// and SIGHUP remove them, say what was interrupted in one line and exit 128 + the signal (130,
// 143, 129); a SIGABRT (a plugin's abort()) removes them before the default action. The final
// file gets the mode of the file it replaces, or 0666 less the umask for a new one.
//
// Note [What an output path may name]
// A symbolic link is followed: the file it names is replaced and the link stays (a link to
// nothing is refused). A character device, FIFO or socket (/dev/null, /dev/stdout, a named pipe)
// is written through, as a shell's redirection would, with nothing renamed over it; a reader of
// a FIFO sees whatever was written before a failure.

#include <string>
#include <vector>

#include "sparsebit/sdk/export.h"

namespace sparsebit {

class SPARSEBIT_API AtomicFile {
 public:
  /// Checks the destination now (not a folder, its folder exists and is writable), so a bad
  /// path fails before any work; nothing is created yet.
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const std::string& bytes);
  void commit();

 private:
  void open_temporary();
  std::string path_, tmp_;
  bool through_ = false;  ///< a device, FIFO or socket: written in place (Note [What an output path may name])
  int fd_ = -1;
  int slot_ = -1;  ///< entry in the list of live temporaries
  bool committed_ = false;
};

/// A path a job reads or writes, and the name the user gave it (a flag, a keyword argument).
struct PathRole {
  std::string name, path;
  bool required = false;  ///< an empty path is an error (otherwise: not given)
};

/// Refuses, before any work, outputs that are the same file as an input or as another output:
/// by identity (device and inode) where the file exists, by absolute path with symbolic links
/// resolved where it does not yet. An empty required output is refused too. Character devices
/// and FIFOs may be named more than once (two reports to /dev/null).
SPARSEBIT_API void check_distinct_paths(const std::vector<PathRole>& inputs, const std::vector<PathRole>& outputs);

/// Note [Files a run read]
/// While a run is going (a FilesReadScope lives: a `sparsebit` command, run_quantize, run_qat,
/// run_prune), every reader of input files (models, their external data, calibration and
/// evaluation samples, configs, ONNX test-data files) notes each regular file it opens, and
/// AtomicFile::commit() refuses to rename over one that is still the version read (same device,
/// inode and change time). check_distinct_paths() compares the paths a command is given before
/// any work, but the files inside a data folder and the external data of a model are only known
/// once read: this catches those (an `-o` into the --calib folder, `--external-data` over the
/// input's own weights file), after the work but before anything is destroyed. Outside a run
/// (a library user loading a model, then exporting over it on purpose) nothing is noted.
SPARSEBIT_API void note_file_read(const std::string& path);

/// Marks a run for Note [Files a run read]; runs may nest, the notes go when the outermost ends.
class SPARSEBIT_API FilesReadScope {
 public:
  FilesReadScope();
  ~FilesReadScope();
  FilesReadScope(const FilesReadScope&) = delete;
  FilesReadScope& operator=(const FilesReadScope&) = delete;
};

/// Installs the handlers of Note [Interrupted runs]; `what` ("quantize model.onnx") goes into
/// the message. Call once, early, from a program's main thread.
SPARSEBIT_API void install_interrupt_cleanup(const std::string& what);

/// Removes every live temporary file of AtomicFile; async-signal-safe.
SPARSEBIT_API void remove_temporary_files() noexcept;

}  // namespace sparsebit
