#pragma once
/// \file
/// Calibration and evaluation data. `--calib PATH` may be
///   - a folder of .npy files, each one sample or one batch for a single-input model;
///   - the ONNX test-data layout: a folder of test_data_set_*/input_<i>.pb (or one such set),
///     for models with several inputs;
///   - an IDX file (MNIST format, plain or gzip), scaled from uint8 to [0, 1];
///   - a folder of JPEG, PNG or BMP images (or one such file), made into samples as the
///     config's [data] table says (Note [Image data]).
/// Every sample is checked against the model's inputs (element type, rank, fixed dims) and for
/// NaN/Inf, and errors name the file.

#include <cstdint>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <optional>
#include <string>
#include <vector>

#include "sparsebit/core/config.h"
#include "sparsebit/sdk/graph.h"

namespace sparsebit {

/// One batch: a tensor per model input (leading batch dimension) and where it came from.
struct Batch {
  std::vector<at::Tensor> inputs;
  std::string source;
  /// True when dim 0 is known to count samples (IDX); otherwise a tensor one rank short of
  /// the model input is taken as a single sample.
  bool batched = false;
  /// Samples in a batch the Batcher delivers (the size of dim 0 of its batched inputs).
  std::int64_t rows = 0;
  /// Of those, the samples `inputs` hold: [first, first + held) (a BatchShare's slice; all of
  /// them by default, none when skipped).
  std::int64_t first = 0, held = 0;
  bool sliced = false;  ///< cut to a BatchShare's slice (a batch that cannot be cut comes whole)
};

/// Which samples of its next batch a caller needs (Note [Distributed runs]): slice `part` of
/// `parts` near-equal slices (samples [rows * part / parts, rows * (part + 1) / parts)), or none
/// (`skip`: the batch is only counted, its data neither checked nor, where the dataset maps its
/// files, read). Batches whose inputs are not all batched along dim 0 come whole.
struct BatchShare {
  int part = 0, parts = 1;
  bool skip = false;
};

class SPARSEBIT_API Dataset {
 public:
  virtual ~Dataset() = default;
  /// Human-readable description ("12 .npy files in calib/").
  virtual std::string describe() const = 0;
  /// Number of samples, if known without reading everything.
  virtual std::optional<std::int64_t> num_samples() const = 0;
  /// Next record (one sample or batch per input, batch dim included), or nullopt at the end.
  virtual std::optional<Batch> next() = 0;
};

/// Opens PATH in whichever of the layouts above it is, for a model with `inputs`; images are read
/// as `images` says (none: a folder of images is refused with a word on [data]).
SPARSEBIT_API std::unique_ptr<Dataset> open_dataset(const std::string& path, const std::vector<ValueInfo>& inputs,
                                                    const DataConfig* images = nullptr);

/// Whether PATH names an image file (.jpg, .jpeg, .png, .bmp in any case).
SPARSEBIT_API bool is_image_file(const std::string& path);

/// What a model input asks of its images: the layout, and the exact size when [data] sets no fit.
struct ImageInput {
  bool nhwc = false;
  std::vector<std::int64_t> model_hw;  ///< {H, W}, or empty: the fit (or the image) decides
};
/// The layout and size for `input` (rank 4); refuses channels the input cannot take.
SPARSEBIT_API ImageInput image_input(const DataConfig& data, const ValueInfo& input);
/// One image file as a [1, C, H, W] (or [1, H, W, C]) float sample; errors name the file.
SPARSEBIT_API at::Tensor read_image(const std::string& path, const DataConfig& data, const ImageInput& input);

/// Image files, one sample each, in the order given.
class SPARSEBIT_API ImageDataset final : public Dataset {
 public:
  ImageDataset(std::vector<std::string> files, std::string folder, DataConfig data, ImageInput input);
  std::string describe() const override;
  std::optional<std::int64_t> num_samples() const override { return std::nullopt; }
  std::optional<Batch> next() override;

 private:
  std::vector<std::string> files_;
  std::string folder_;
  DataConfig data_;
  ImageInput input_;
  std::size_t pos_ = 0, skipped_ = 0;
};

/// Opens a dataset afresh (from its first sample) for a model with `inputs`.
using DatasetOpener = std::function<std::unique_ptr<Dataset>(const std::vector<ValueInfo>& inputs)>;

/// Note [Data sources]
/// Where a step's samples come from, carried by value in the job: a path in one of the layouts
/// above, or an opener the application supplies (the Python package's iterables, a host's own
/// records or generator) under a name for messages. Every step that reads samples opens the
/// source afresh (calibration, lifting's sample run, the target's held-out samples, QAT's
/// epochs, bias compensation, BN re-estimation), so an opener must start from the first sample
/// each time. Nothing is registered process-wide: two jobs in one process never share data by
/// accident, and a source lives exactly as long as the job that holds it.
class SPARSEBIT_API DataSource {
 public:
  DataSource() = default;        ///< none
  DataSource(std::string path);  // NOLINT(google-explicit-constructor): a path is a source
  DataSource(const char* path);  // NOLINT(google-explicit-constructor)
  DataSource(std::string name, DatasetOpener opener);

  bool empty() const { return path_.empty() && !opener_; }
  /// The file or folder; "" for an application's source (nothing on disk to guard).
  const std::string& path() const { return path_; }
  /// What messages call it: the path, or "<name>".
  std::string name() const;
  /// What names it to a QAT checkpoint and to the other ranks: the absolute path, or "<name>".
  std::string identity() const;
  /// A fresh dataset from the first sample; errors name the source.
  std::unique_ptr<Dataset> open(const std::vector<ValueInfo>& inputs) const;
  /// This source with images read as `images` says (a config's [data]); an application's
  /// opener, or a source that already has its [data], is returned as it is.
  DataSource with_images(const std::optional<DataConfig>& images) const;

 private:
  std::string path_, name_;
  DatasetOpener opener_;
  std::shared_ptr<const DataConfig> images_;
};

/// Inputs for one sample: the first sample of `calib` when given, else drawn from the model's
/// declared input shapes (unknown batch dims become 1; another unknown dim is an Error that asks
/// for --calib).
SPARSEBIT_API std::vector<at::Tensor> sample_inputs(const Graph& graph, const DataSource& calib = {});

/// Regroups any dataset's records into batches of exactly `batch_size` samples, stopping after
/// `limit` samples (0: no limit). A batch holds samples of one size only: where consecutive
/// samples differ in a dim the model leaves open (symbolic width, length), the batch before the
/// change is delivered smaller. The last batch may be smaller too. Validates every record.
/// A model input with a fixed batch size caps the batch; one declared 0-d (a scalar such as a
/// sample rate) takes each record's value as it is, one sample per batch. An input whose dim 0
/// is declared other than the first input's (a recurrent state [layers, batch, hidden]) has its
/// batch elsewhere: then every record is one batch, taken as it is.
class SPARSEBIT_API Batcher {
 public:
  Batcher(Dataset& data, const std::vector<ValueInfo>& inputs, std::int64_t batch_size, std::int64_t limit);
  std::optional<Batch> next(const BatchShare& share = {});
  std::int64_t samples_delivered() const { return delivered_; }

 private:
  /// Records, or what is left of them, waiting for a batch (records are joined only when a
  /// batch is delivered, and only the samples asked for).
  struct Part {
    std::vector<at::Tensor> inputs;
    std::string source;
    std::int64_t offset = 0;  ///< of inputs' first sample in the record, for messages
  };
  std::int64_t rows_of(const Part& p) const;
  Dataset& data_;
  std::vector<ValueInfo> inputs_;
  std::vector<bool> scalar_;      ///< inputs the model declares 0-d (a sample rate): passed as they are
  std::size_t lead_;              ///< the first input with a batch dimension (npos: none)
  std::vector<bool> other_axis_;  ///< inputs whose dim 0 is not the batch (a recurrent state)
  bool whole_records_ = false;    ///< some input is other_axis_: records are batches as they are
  std::int64_t batch_size_, limit_, delivered_ = 0;
  std::vector<Part> pending_;
  std::optional<Part> held_;  ///< a record of other sizes, first in the next batch
  bool exhausted_ = false;
};

/// A Batcher's batches, read ahead on a background thread (at most `depth` waiting), so reading
/// and decoding the next batch overlaps the work on the current one. The Batcher and its
/// dataset are used only from that thread until the Prefetcher is destroyed.
class SPARSEBIT_API Prefetcher {
 public:
  /// `share`: what the caller needs of batch number i (0-based); all of every batch by default.
  explicit Prefetcher(Batcher& batcher, std::function<BatchShare(std::int64_t)> share = {}, std::size_t depth = 2);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;
  /// The next batch, or nullopt at the end; rethrows what the reader threw.
  std::optional<Batch> next();

 private:
  void read();
  Batcher& batcher_;
  std::function<BatchShare(std::int64_t)> share_;
  std::size_t depth_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Batch> ready_;
  bool done_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread reader_;
};

/// Samples [first, first + count) of another dataset (count 0: to its end), one sample per
/// record. The accuracy target keeps the first calibration samples apart this way to measure
/// the quantized model on data it was not calibrated on.
class SPARSEBIT_API SampleWindow final : public Dataset {
 public:
  SampleWindow(std::unique_ptr<Dataset> data, const std::vector<ValueInfo>& inputs, std::int64_t first,
               std::int64_t count);
  std::string describe() const override;
  std::optional<std::int64_t> num_samples() const override;
  std::optional<Batch> next() override;

 private:
  std::unique_ptr<Dataset> data_;
  Batcher samples_;
  std::int64_t first_, count_, read_ = 0;
};

/// Reads an IDX file (optionally gzip-compressed) as a uint8/int tensor of its stored shape.
SPARSEBIT_API at::Tensor read_idx(const std::string& path, std::int64_t max_items = 0);
/// Reads an IDX label file: one integer per sample, as int64 of rank 1.
SPARSEBIT_API at::Tensor read_labels(const std::string& path);
/// Reads / writes a .npy array (little-endian, C order).
SPARSEBIT_API at::Tensor read_npy(const std::string& path);
SPARSEBIT_API void write_npy(const at::Tensor& t, const std::string& path);

}  // namespace sparsebit
