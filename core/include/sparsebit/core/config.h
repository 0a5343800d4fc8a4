#pragma once
/// \file
/// The TOML configuration. Every key is checked: an unknown key is an Error naming the file,
/// the table and the nearest valid key.
///
///     backend = "tensorrt"            # virtual | onnxruntime | tensorrt (or a plugin's)
///     skip = ["fc2", "conv1*"]        # node-name globs kept in float
///     [w]                             # weights
///     type = "int"                    # int | fp8_e4m3 | fp8_e5m2 (8-bit floats, symmetric)
///     qscheme = "per-channel-symmetric"   # per-{tensor,channel,group}-{symmetric,affine}
///     bits = 8
///     group_size = 128                # per-group: block size along the weight's input axis
///     observer = "minmax"
///     quantizer = "uniform"
///     narrow_range = false
///     disable = false
///     [w.observer_options]            # passed to the observer plugin; unread keys are errors
///     [a]                             # activations, same keys; without [a] (and with [w])
///                                     #   only weights are quantized, activations stay float
///     [[specific]]                    # per-node overrides; the first entry whose glob
///     nodes = ["/head/*"]             #   matches a node applies to all its inputs
///     w = { bits = 4 }                #   any [w]/[a] key; unset keys come from [w]/[a]
///     a = { observer = "percentile", observer_options = { alpha = 1e-2 } }
///     [schedule]                      # passes on/off by name (defaults: Config::schedule)
///     disable_unnecessary_quant = true
///     fuse_bn = true
///     bn_tuning = false               # built in: see bn_tuning.h
///     [passes]                        # more passes (from plugins) and their order
///     extra = ["my_pass"]             #   appended to the schedule, on
///     order = ["fuse_bn", "my_pass"]  #   these run first, in this order; the rest keep theirs
///     [passes.my_pass]                #   options handed to that pass; unread keys are errors
///     [calibration]
///     batch_size = 32
///     count = 512                     # samples used (0: all)
///     device = "cpu"
///     mode = "streaming"              # streaming | layerwise | asym (Note [Layerwise runner])
///     range_samples = 8               # samples the auto observer's ranges are chosen on (0: off);
///                                     # the next 2 x range_samples judge them at the output
///     [qat]                           # `sparsebit qat` (sparsebit/core/qat.h)
///     epochs = 1
///     lr = 1e-4
///     loss = "mse"                    # mse | kl
///     [sparse]                        # pruning (sparsebit/core/prune.h); with [w]/[a] too:
///     sparser = "l1_structured"       #   prune, then quantize, in one run
///     ratio = 0.5                     # fraction of weights / channels removed per layer
///     granularity = "channel"         # element | channel | N:M ("2:4"); default: the sparser's
///     scope = "layer"                 # element: ratio per layer, or "global" over all layers
///     round_to = 1                    # channel: kept channels rounded up to a multiple
///     bias_compensation = false       # biases keep the removed weights' mean (needs --calib)
///     skip = ["conv1"]                # node-name globs never pruned
///     [[sparse.specific]]             # per-node ratio, first match wins (also accepted as
///     nodes = ["layer4*"]             #   `sparse = { ratio = 0.3 }` in a top-level [[specific]])
///     ratio = 0.3
///     [target]                        # accuracy target (sparsebit/core/target.h)
///     metric = "cosine"               #   cosine | sqnr | mse | maxabs | argmax-agreement |
///                                     #   ctc-agreement | top1-drop (needs --eval-data/--eval-labels)
///     value = 0.99                    #   cosine, sqnr, *-agreement: at least; the rest: at most
///     ctc_blank = 0                   #   ctc-agreement: the blank's class (-1: the last)
///     fallback = ["range", "per-channel", "int16", "float"]  # remedies, cheapest first, for the
///                                     #   layers whose output strays most (default: all four)
///     max_fallback_layers = 8         #   layers in int16 or float: default 10% of the quantized
///                                     #   layers (at least 1); range and per-channel cost nothing
///     holdout = 16                    #   calibration samples kept apart to measure the metric
///     strict = false                  #   true: a target missed is an error and nothing is written
///     [export]
///     weight_format = "matmul_nbits"  # or "dequantize_linear" (default); per-group MatMul/Gemm
///     accuracy_level = 4              #   weights as com.microsoft.MatMulNBits (ONNX Runtime)
///     [plugins]
///     paths = []
///     enable = []
///     disable = []

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sparsebit/core/registry.h"
#include "sparsebit/sdk/options.h"
#include "sparsebit/sdk/quant.h"

namespace sparsebit {

struct SPARSEBIT_API QuantTableConfig {
  /// "int" (integers of `bits`), "fp8_e4m3" or "fp8_e5m2" (Note [Float8 elements] in quant.h:
  /// 8-bit floats, symmetric, per tensor or per channel).
  std::string type = "int";
  std::string qscheme;
  int bits = 8;
  std::int64_t group_size = 0;      ///< block size for per-group-* schemes
  std::string observer = "minmax";  ///< [a]'s default is "auto" (Config::Config)
  std::string quantizer = "uniform";
  bool narrow_range = false;
  bool reduce_range = false;  ///< weights only: a 7-bit grid stored in 8 bits (QSpec::reduce_range)
  /// weights only: also quantize the constant tables of index lookups (Gather's data, an
  /// embedding), grouped along the row (InputSpec::lookup_table)
  bool embeddings = false;
  bool disable = false;
  Options observer_options;
  Options quantizer_options;

  /// The QSpec of a tensor quantized under this table.
  QSpec spec(bool is_weight, std::int64_t channel_axis) const;
};

struct CalibrationConfig {
  int batch_size = 32;
  int count = 0;  ///< 0: every sample
  std::string device = "cpu";
  std::string mode = "streaming";
  /// On a GPU, each reconstruction step (AdaRound's) is recorded as a CUDA graph after a few
  /// eager ones and replayed (Note [Recorded reconstruction steps]); eager where it cannot be.
  /// The same arithmetic as eager steps, so on by default.
  bool cuda_graph = true;
  /// Calibration samples on which quantized inputs whose observer offers several ranges (auto)
  /// choose one by their consuming layer's error (Note [Choosing ranges by the consuming
  /// layer]); 0 leaves the choice to the observer.
  int range_samples = 8;
  /// Weight-only runs whose weights are solved (AWQ, GPTQ, a clip search) are checked against
  /// round to nearest at the model's output and fall back to it where it does better (Note
  /// [Solved weights against rounding]).
  bool rounding_check = true;
};

/// `[qat]`: quantization-aware training by distillation (sparsebit/core/qat.h).
struct QatConfig {
  int epochs = 1;
  double lr = 1e-4;  ///< Adam learning rate
  double weight_decay = 0;
  int batch_size = 32;
  int count = 0;             ///< training samples per epoch (0: all)
  std::string loss = "mse";  ///< mse | kl (on softmax over axis 1 at `temperature`)
  double temperature = 1;
  std::int64_t seed = 0;
  /// TensorFloat-32 convolutions and matrix products on GPUs while training (calibration and
  /// evaluation keep full FP32): faster, with products rounded to 10 mantissa bits; 2-D
  /// convolutions then run channels-last (Note [Channels-last on GPUs]).
  bool tf32 = false;
  /// Keep the teacher's outputs of each batch from the first epoch for the next ones (the
  /// training data come in the same order every epoch): no teacher forward after epoch 1, at
  /// the cost of the outputs' size x samples in memory on the training device.
  bool cache_teacher = false;
  /// On a GPU, record one training step (teacher forward, student forward, loss, backward,
  /// Adam) as CUDA graphs after a few eager steps and replay them for every batch of the same
  /// shape (Note [CUDA graph steps]): no per-operator host work. A model whose step cannot be
  /// recorded (an operator that reads values on the host) trains eagerly, with a warning.
  bool cuda_graph = false;
  /// Deterministic algorithms while training (ATen's switch; on GPUs cuDNN's deterministic
  /// convolutions and CUBLAS_WORKSPACE_CONFIG): the same losses on every run, slower.
  bool deterministic = false;
};

/// `[export]`: how quantized weights are written.
struct ExportConfig {
  /// "dequantize_linear" (integers + DequantizeLinear, blocked at opset 21 for per-group) or
  /// "matmul_nbits": per-group 4/8-bit MatMul and Gemm weights as ONNX Runtime's
  /// com.microsoft.MatMulNBits (Note [MatMulNBits export]); other weights keep DequantizeLinear.
  std::string weight_format = "dequantize_linear";
  std::int64_t accuracy_level = 0;  ///< MatMulNBits' accuracy_level: 0 (unset) to 4 (int8 compute)
};

/// `[latency]`: the export and the float model timed in ONNX Runtime after `quantize` (Note
/// [Latency step] in core/src/pipeline/latency.cpp).
struct LatencyConfig {
  /// "auto": where the runtime is found (else the run says so); "on": required; "off".
  std::string enabled = "auto";
  std::vector<std::int64_t> threads{1, 0};  ///< intra-op thread counts to time; 0: every core
  std::int64_t runs = 20;                   ///< timed runs per model and thread count (medians)
  std::string runtime;                      ///< the onnxruntime-node package folder ("": searched, Note [Latency step])
  bool search = true;                       ///< time quantized regions as float (Note [Latency search])
  std::int64_t regions = 12;                ///< at most this many regions timed, least compute first
};

/// `[[sparse.specific]]`: the ratio for the nodes matching `nodes`.
struct SparseSpecific {
  std::string name;  ///< "[[sparse.specific]] #1", for messages
  std::vector<std::string> nodes;
  double ratio = 0;
};

/// `[sparse]`: pruning (sparsebit/core/prune.h).
struct SPARSEBIT_API SparseConfig {
  std::string sparser = "l1_unstructured";
  double ratio = 0.5;
  bool ratio_set = false;
  std::string granularity;  ///< "" (the sparser's), "element", "channel" or "N:M"
  std::string scope = "layer";
  std::int64_t round_to = 1;
  bool bias_compensation = false;  ///< with calibration data (sparsebit/core/prune.h)
  std::vector<std::string> skip;
  std::vector<SparseSpecific> specific;  ///< first match wins
  Options sparser_options{"[sparse.sparser_options]"};
};

/// One `[[specific]]` entry: complete [w]/[a] tables (the global ones with this entry's keys
/// over them) for the nodes matching `nodes`.
struct SpecificEntry {
  std::string name;                ///< "[[specific]] #2", for messages
  std::vector<std::string> nodes;  ///< globs over node names and torch module paths (node_matches_any)
  /// Whether the entry has a `w` / an `a` table: a node's weights follow the first matching entry
  /// that sets `w`, its activations the first that sets `a` (each side on its own, as the
  /// original toolkit's W.SPECIFIC and A.SPECIFIC lists do).
  bool sets_w = true;
  bool sets_a = true;
  QuantTableConfig w;
  QuantTableConfig a;
};

/// `[bit_allocation]`: per-layer bit widths chosen by measured sensitivity under average budgets
/// (sparsebit/core/bit_allocation.h; the original toolkit's SCHEDULE.BIT_ALLOCATION).
struct BitAllocationConfig {
  /// Average bits of the quantized weights, weighted by their parameter counts (unset: weights
  /// keep their bits).
  std::optional<double> avg_weight_bits;
  /// Average bits of the weighted layers' activation inputs, weighted by the layers' MACs
  /// (unset: activations keep their bits).
  std::optional<double> avg_activation_bits;
  std::vector<int> choices{4, 8};  ///< the widths a layer may get
  std::int64_t samples = 32;       ///< calibration samples the sensitivities are measured on
};

/// `[target]` (or `--target "cosine>=0.99"`): the accuracy the quantized model must keep, and
/// what may be given up to reach it (sparsebit/core/target.h).
struct SPARSEBIT_API TargetConfig {
  std::string metric = "cosine";  ///< cosine | sqnr | mse | maxabs | argmax-agreement | ctc-agreement | top1-drop
  double value = 0.99;
  /// False for a [target] table that sets only the search (fallback, budget, holdout) and
  /// leaves metric and value to --target; quantize refuses it without one.
  bool has_value = true;
  /// Per-layer remedies, cheapest first (Note [Accuracy target] in target.h).
  std::vector<std::string> fallback{"range", "per-channel", "int16", "float"};
  std::int64_t max_fallback_layers = -1;  ///< int16 + float layers; -1: 10% of the quantized layers, at least 1
  std::int64_t holdout = 16;
  bool strict = false;
  /// Graph outputs the metric is measured on (empty: every floating-point output), e.g. a voice
  /// detector's probability and not the recurrent state it also returns.
  std::vector<std::string> outputs;
  /// ctc-agreement: the class of the blank (negative: from the end; TensorFlow's CTC uses the last).
  std::int64_t ctc_blank = 0;
  /// Whether larger values of the metric are better (cosine, sqnr, the agreements).
  bool higher_is_better() const {
    return metric == "cosine" || metric == "sqnr" || metric == "argmax-agreement" || metric == "ctc-agreement";
  }
  /// "cosine>=0.99"
  std::string describe() const;
  /// Parses "cosine>=0.99", "sqnr>=30", "mse<=1e-3", "maxabs<=0.02", "argmax-agreement>=0.99",
  /// "ctc-agreement>=0.99", "top1-drop<=0.5" into metric and value
  /// (the comparison must be the one the metric takes); `where` names the source in errors.
  void parse_expression(const std::string& text, const std::string& where);
  /// Refuses a value the metric can never reach (cosine or an agreement above 1, a negative
  /// mse or maxabs).
  void check_value(const std::string& where) const;
};

/// Note [Image data]
/// `[data]`: how a folder of images (JPEG, PNG, BMP, decoded by stb_image) becomes model input,
/// read for calibration, evaluation and training data alike. A preset fills every key; keys set
/// beside it override it. Pixels are 0..255; a sample is ((pixel * scale) - mean) / std per
/// channel, after the resize and the crop.
///   fit = "shorter"  resize = N: the shorter side to N, aspect kept (torchvision's Resize(N))
///   fit = "exact"    resize = [H, W]
///   fit = "height"   resize = [H, W]: height H, aspect kept up to width W, padded on the right
///                    to W with pad_value (PaddleOCR's recognizer)
///   fit = "longer"   resize = N: the longer side shrunk to at most N, each side then rounded to
///                    a multiple of `multiple` (PaddleOCR's detector)
///   fit = "letterbox" resize = [H, W]: scaled to fit inside, centred, padded with pad_value (YOLO)
/// Without `resize`, a model input of fixed height and width gets an exact resize to them.
struct DataConfig {
  std::string preset;                     ///< "" or imagenet | paddleocr_rec | paddleocr_det | yolo
  std::string fit;                        ///< "" (none), shorter, exact, height, longer, letterbox
  std::vector<std::int64_t> resize;       ///< {N} or {H, W}
  std::vector<std::int64_t> center_crop;  ///< {} or {H, W}
  std::int64_t multiple = 1;              ///< fit = "longer": sides rounded to a multiple of this
  double pad_value = 0;                   ///< pixel value (0..255) of padding
  bool antialias = true;                  ///< bilinear with antialiasing (PIL, torchvision); false: OpenCV's
  std::string channels = "RGB";           ///< RGB | BGR | GRAY
  std::string layout = "auto";            ///< NCHW | NHWC | auto (from the model's input)
  double scale = 1.0 / 255;
  std::vector<double> mean{0}, std{1};  ///< one value, or one per channel
  std::string undecodable = "error";    ///< error | skip (named in a warning)
};

/// `[schedule]` and `[passes]` as the file writes them. Which passes exist, their order and
/// whether they run by default come from the plugins that register them: resolve_schedule
/// (sparsebit/core/passes.h) checks these settings against a registry (Note [Pass schedule]).
struct PassSettings {
  std::map<std::string, bool> switches;    ///< [schedule] <pass> = true | false
  std::vector<std::string> order;          ///< [passes] order: these first, in this order
  std::vector<std::string> extra;          ///< [passes] extra: passes without a default place, turned on
  std::map<std::string, Options> options;  ///< [passes.<pass>]
  /// The [schedule] switch for `pass`, if the config sets one.
  std::optional<bool> switched(const std::string& pass) const {
    auto it = switches.find(pass);
    return it == switches.end() ? std::nullopt : std::optional<bool>(it->second);
  }
};

struct SPARSEBIT_API Config {
  std::string source = "<defaults>";  ///< file the config came from, for messages
  std::uint64_t text_digest = 0;      ///< of the TOML text it was read from (ranks of one run compare it)
  std::string backend = "virtual";
  QuantTableConfig w;
  QuantTableConfig a;
  std::vector<std::string> skip;
  std::vector<SpecificEntry> specific;  ///< first match wins, per side (SpecificEntry::sets_w)
  CalibrationConfig calibration;
  QatConfig qat;
  std::optional<SparseConfig> sparse;                 ///< set when the file has a [sparse] table
  std::optional<TargetConfig> target;                 ///< set by a [target] table or --target
  std::optional<BitAllocationConfig> bit_allocation;  ///< set by a [bit_allocation] table
  bool quantization_given = false;                    ///< the file has [w] or [a] (a prune run then quantizes too)
  ExportConfig export_options;                        ///< [export]
  LatencyConfig latency;                              ///< [latency]
  std::optional<DataConfig> data;                     ///< [data]: how image files become input
  bool weight_only = false;  ///< [w] without [a]: activations stay float (Note [Weight-only quantization])
  PluginSearch plugins;
  PassSettings passes;  ///< [schedule] and [passes]

  Config();
  static Config from_file(const std::string& path);
  static Config from_string(const std::string& text, const std::string& source_name);
};

/// The torch module a node was exported from, read from torch.onnx's scope naming: every scope
/// is a "/"-separated component before the op, an attribute name or, for a container's child,
/// "<container>.<index>" ("/layer2/layer2.0/downsample/downsample.0/Conv" comes from module
/// "layer2.0.downsample.0"). "" for names of other exporters and for nodes of the top-level module.
SPARSEBIT_API std::string module_path_of(const std::string& node_name);

/// Whether a config file is YAML (.yaml, .yml): the original toolkit's schema (Note [YAML configs]).
SPARSEBIT_API bool is_yaml_config(const std::string& path);

/// The original toolkit's YAML config (BACKEND, SCHEDULE, W, A with QSCHEME, QUANTIZER, OBSERVER,
/// SPECIFIC) as Sparsebit TOML, its defaults and meanings kept; throws Error naming the YAML key
/// for anything without an equivalent. Config::from_file reads .yaml files through it.
SPARSEBIT_API std::string yaml_config_to_toml(const std::string& text, const std::string& source_name);

/// A message for one line of a terminal: printable() (error.h) up to `max` bytes, but the middle
/// goes rather than the end, which says what went wrong after a path that may be long.
SPARSEBIT_API std::string one_line_message(const std::string& text, std::size_t max = 4000);

/// A name from a model or a path, made safe to write into a text file or onto the terminal:
/// control characters escaped as printable() does (but line feeds and tabs with `keep_lines`),
/// and bytes that are not UTF-8 as \xNN (a drawing, an HTML page or a log line then neither
/// breaks nor steers anything). Not cut short.
SPARSEBIT_API std::string displayed(const std::string& text, bool keep_lines = false);

/// Passes every log message (the host's and every plugin's) through displayed(.., true) on its
/// way to stderr (the library's own logger; spdlog's default logger is left alone); the CLI and
/// the Python module call it once.
SPARSEBIT_API void escape_log_messages();

/// Closest string to `key` among `candidates` by edit distance ("" if none is close).
SPARSEBIT_API std::string nearest(const std::string& key, const std::vector<std::string>& candidates);

}  // namespace sparsebit
