// Adversarial use of the command line and of the input readers: every case reproduces a way a
// user's files were lost, a run hung, or a message misled, and checks the fixed behaviour.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <onnx/onnx_pb.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "sparsebit/core/atomic_file.h"
#include "sparsebit/core/data.h"
#include "sparsebit/core/onnx_io.h"
#include "sparsebit/sdk/error.h"
#include "test_support.h"

namespace sparsebit {
namespace {

namespace fs = std::filesystem;
using testing::run_cli;

const std::string kImages = std::string(FASHION_MNIST_DIR) + "/train-images-idx3-ubyte.gz";

class Hardening : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = (work_.path() / "m.onnx").string();
    fs::copy_file(testing::fixture_model(), model_);
    config_ = (work_.path() / "c.toml").string();
    fs::copy_file(testing::source_path("configs/w8a8_tensorrt.toml"), config_);
  }
  std::string quantize(const std::string& extra) {
    return "quantize " + model_ + " -c " + config_ + " --calib " + kImages + " --calib-count 64 " + extra;
  }
  // Exit status 1 and one error line holding every needle (besides the run's info/warning lines).
  void expect_one_line_error(const testing::CommandResult& r, const std::vector<std::string>& needles) {
    EXPECT_EQ(r.exit_code, 1) << r.output;
    std::stringstream lines(r.output);
    std::string error;
    int errors = 0;
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("error", 0) == 0) {
        ++errors;
        error = line;
      }
    }
    EXPECT_EQ(errors, 1) << r.output;
    for (const auto& n : needles)
      EXPECT_NE(error.find(n), std::string::npos) << "missing '" << n << "' in " << r.output;
  }
  // x [N, 16] -> Gemm `first` -> Relu -> Gemm -> y [N, 8], every tensor of `type`; its path.
  std::string two_gemms(const std::string& file, const std::string& first, at::ScalarType type) {
    const std::int32_t onnx_type = type == at::kDouble ? 11 : type == at::kHalf ? 10 : 1;
    Graph g;
    g.opset_imports[""] = 13;
    g.inputs = {{"x", onnx_type, true, {{-1, "N"}, {16, ""}}, ""}};
    g.outputs = {{"y", onnx_type, true, {{-1, "N"}, {8, ""}}, ""}};
    g.initializers["w1"] = at::randn({16, 16}, type);
    g.initializers["w2"] = at::randn({8, 16}, type);
    g.append(testing::make_node(first, "Gemm", {"x", "w1"}, {"h"}, {{"transB", Attribute::of_int(1)}}));
    g.append(testing::make_node("relu", "Relu", {"h"}, {"r"}));
    g.append(testing::make_node("fc2", "Gemm", {"r", "w2"}, {"y"}, {{"transB", Attribute::of_int(1)}}));
    const std::string path = (work_.path() / file).string();
    save_onnx(g, ModelMeta{}, path);
    return path;
  }
  // A folder of four samples [16] of `type`.
  fs::path samples(at::ScalarType type) {
    const fs::path data = work_.path() / "data";
    fs::create_directories(data);
    for (int i = 0; i < 4; ++i) write_npy(at::randn({16}, type), (data / ("s" + std::to_string(i) + ".npy")).string());
    return data;
  }
  testing::TempDir work_;
  std::string model_, config_;
};

TEST_F(Hardening, OutputsThatAreInputsOrEachOtherAreRefusedBeforeAnyWork) {
  const std::string model_bytes = testing::read_text(model_), config_bytes = testing::read_text(config_);
  const fs::path idx = work_.path() / "calib.idx.gz";
  fs::copy_file(kImages, idx);
  fs::create_symlink(model_, work_.path() / "alias.onnx");
  const std::string q = (work_.path() / "q.onnx").string();
  for (const auto& args : std::vector<std::string>{
           "inspect " + model_ + " --dot " + model_,
           "inspect " + model_ + " --mermaid " + (work_.path() / "alias.onnx").string(),
           quantize("-o " + q + " --report " + model_), quantize("-o " + q + " --report " + q),
           quantize("-o " + config_),
           "quantize " + model_ + " -c " + config_ + " --calib " + idx.string() + " -o " + idx.string(),
           "prune " + model_ + " -c " + testing::source_path("configs/prune_channels_50.toml") + " -o " + q +
               " --masked " + q,
           "simplify " + model_ + " -o " + (work_.path() / "." / "m.onnx").string()}) {
    auto r = run_cli(args);
    expect_one_line_error(r, {"is the same file as"});
  }
  EXPECT_EQ(testing::read_text(model_), model_bytes);
  EXPECT_EQ(testing::read_text(config_), config_bytes);
  EXPECT_EQ(testing::read_text(idx.string()), testing::read_text(kImages));
  EXPECT_FALSE(fs::exists(q));
  expect_one_line_error(run_cli(quantize("-o \"\"")), {"-o", "empty"});
}

// Files known only once read (Note [Files a run read]): a sample inside the --calib folder is
// refused before any work; the input model's own external-data file, which `--external-data`
// would write over, after the work and before anything is replaced.
TEST_F(Hardening, FilesInsideInputFoldersAndExternalDataAreInputsToo) {
  const fs::path data = work_.path() / "data";
  fs::create_directories(data);
  for (int i = 0; i < 4; ++i) write_npy(at::rand({1, 28, 28}), (data / ("s" + std::to_string(i) + ".npy")).string());
  const std::string sample = (data / "s2.npy").string(), sample_bytes = testing::read_text(sample);
  const std::string with_data = model_ + " -c " + config_ + " --calib " + data.string();
  expect_one_line_error(run_cli("quantize " + with_data + " -o " + sample), {"-o", "inside --calib", "another path"});
  expect_one_line_error(
      run_cli("quantize " + with_data + " -o " + (work_.path() / "q.onnx").string() + " --report " + sample),
      {"--report", "inside --calib"});
  EXPECT_EQ(testing::read_text(sample), sample_bytes);

  // The model with its weights in q.onnx.data, exported to q.onnx with external data.
  Model m = load_onnx(model_);
  const fs::path external = work_.path() / "ext";
  fs::create_directories(external);
  ExportOptions options;
  options.external_data = true;
  std::string weights;
  testing::write_text((external / "in.onnx").string(),
                      serialize_onnx(m.graph, m.meta, options, &weights, "q.onnx.data"));
  ASSERT_FALSE(weights.empty());
  testing::write_text((external / "q.onnx.data").string(), weights);
  expect_one_line_error(run_cli("quantize " + (external / "in.onnx").string() + " -c " + config_ + " --calib " +
                                data.string() + " -o " + (external / "q.onnx").string() + " --external-data"),
                        {"q.onnx.data", "read that file as input"});
  EXPECT_EQ(testing::read_text((external / "q.onnx.data").string()), weights);
  EXPECT_FALSE(fs::exists(external / "q.onnx"));
}

// Note [What an output path may name]: a link's target is replaced and the link kept; a link to
// nothing is refused; a FIFO (like /dev/null or /dev/stdout) is written through, not replaced;
// a name near the file system's 255-byte limit still gets its temporary.
TEST_F(Hardening, OutputsFollowLinksWriteThroughFifosAndTakeLongNames) {
  const fs::path dir = work_.path();
  testing::write_text((dir / "target.onnx").string(), "old");
  fs::create_symlink("target.onnx", dir / "link.onnx");
  ASSERT_EQ(run_cli(quantize("-o " + (dir / "link.onnx").string())).exit_code, 0);
  EXPECT_TRUE(fs::is_symlink(dir / "link.onnx"));
  EXPECT_NE(testing::read_text((dir / "target.onnx").string()), "old");  // the model, through the link
  EXPECT_NO_THROW(load_onnx((dir / "target.onnx").string()));

  fs::create_symlink("missing/nowhere.onnx", dir / "dangling.onnx");
  expect_one_line_error(run_cli(quantize("-o " + (dir / "dangling.onnx").string())),
                        {"dangling.onnx", "symbolic link", "cannot be reached"});
  EXPECT_TRUE(fs::is_symlink(dir / "dangling.onnx"));

  const fs::path fifo = dir / "report.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string received;
  std::thread reader([&] { received = testing::read_text(fifo.string()); });
  auto r = run_cli(quantize("-o " + (dir / "q.onnx").string() + " --report " + fifo.string()));
  if (const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK); fd >= 0) ::close(fd);  // a reader still waiting
  reader.join();
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_NO_THROW((void)nlohmann::json::parse(received)) << received.substr(0, 200);

  const std::string long_name = std::string(250, 'n') + ".onnx";  // 255 bytes
  r = run_cli(quantize("-o " + (dir / long_name).string()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / long_name));
}

// File names are bytes: one that is not UTF-8 must not fail the JSON report after all the work.
TEST_F(Hardening, PathsThatAreNotUtf8ReachTheReport) {
  const fs::path odd = work_.path() / "mod\xff\xfe.onnx";
  fs::copy_file(model_, odd);
  const std::string report = (work_.path() / "r.json").string();
  auto r = run_cli("quantize '" + odd.string() + "' -c " + config_ + " --calib " + kImages + " --calib-count 64 -o " +
                   (work_.path() / "q.onnx").string() + " --report " + report);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto j = nlohmann::json::parse(testing::read_text(report));
  EXPECT_NE(j["model"].get<std::string>().find("mod\xEF\xBF\xBD"), std::string::npos) << j["model"];  // U+FFFD
}

// A path beyond PATH_MAX: the message keeps its reason (the middle of the path goes, not the end).
TEST_F(Hardening, PathsBeyondPathMaxSayWhy) {
  std::string deep = work_.path().string();
  for (int i = 0; i < 2100; ++i) deep += "/a";
  for (const std::string& args : {"quantize " + deep + "/m.onnx -c " + config_ + " --calib " + kImages + " -o q.onnx",
                                  quantize("-o " + deep + "/q.onnx"),
                                  "quantize " + model_ + " -c " + deep + "/c.toml --calib " + kImages + " -o q.onnx"}) {
    auto r = run_cli(args);
    expect_one_line_error(r, {"characters)", "too long"});
    EXPECT_LT(r.output.size(), 4500u);
  }
}

// Note [Interrupted runs]: a signal removes live temporaries and exits 128 + the signal.
TEST_F(Hardening, SignalsRemoveTemporariesAndExitWithTheSignalNumber) {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    const fs::path dir = work_.path() / ("sig" + std::to_string(sig));
    fs::create_directories(dir);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      install_interrupt_cleanup("a test");
      AtomicFile a((dir / "a.onnx").string()), b((dir / "b.json").string());
      a.write("partial");
      b.write("partial");
      ::raise(sig);
      ::_exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 128 + sig);
    EXPECT_EQ(testing::count_files(dir), 0) << "temporaries left after signal " << sig;
  }
  // The real command, interrupted while calibrating: no file at all, one line, exit 130. The
  // signal goes out once the command says it is calibrating, not after a fixed delay: a shell
  // starts background commands with SIGINT ignored, so a signal that arrives before the command
  // has installed its handler (a slow start under a sanitizer on a loaded machine) is lost.
  const fs::path out = work_.path() / "out";
  fs::create_directories(out);
  const std::string log = (work_.path() / "log").string();
  const std::string cmd = "SPARSEBIT_PLUGIN_PATH= " + std::string(SPARSEBIT_CLI) + " quantize " + model_ + " -c " +
                          config_ + " --calib " + kImages + " --calib-count 0 -o " + (out / "q.onnx").string() +
                          " --report " + (out / "r.json").string() + " 2>" + log;
  auto r = testing::run_command("(" + cmd + " & pid=$!; for i in $(seq 1200); do grep -q 'calibrating on' " + log +
                                " && break; sleep 0.1; done; kill -INT $pid; wait $pid; status=$?; cat " + log +
                                "; exit $status)");
  EXPECT_EQ(r.exit_code, 130) << r.output;
  EXPECT_NE(r.output.find("interrupted by SIGINT"), std::string::npos) << r.output;
  EXPECT_EQ(testing::count_files(out), 0);
}

TEST_F(Hardening, OutputsHonourTheUmaskAndKeepTheModeOfAReplacedFile) {
  const mode_t old = umask(027);
  const std::string path = (work_.path() / "new.bin").string();
  {
    AtomicFile f(path);
    f.write("x");
    f.commit();
  }
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  chmod(path.c_str(), 0600);
  {
    AtomicFile f(path);
    f.write("y");
    f.commit();
  }
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  umask(old);
  // Nothing is created before the first write: a writer that is never used leaves no trace.
  { AtomicFile unused((work_.path() / "unused.onnx").string()); }
  EXPECT_FALSE(fs::exists(work_.path() / "unused.onnx"));
}

TEST_F(Hardening, ArgumentErrorsAreOneLineNamingTheFlagAndExitOne) {
  const std::string q = " -o " + (work_.path() / "q.onnx").string();
  const std::string profile = "profile " + model_ + " -c " + config_ + " --calib " + kImages;
  const std::string qat = "qat " + model_ + " -c " + config_ + " --calib " + kImages + " --train " + kImages + q;
  for (const auto& [args, flag] : std::vector<std::pair<std::string, std::string>>{
           {"--threads 0 plugins", "--threads"},
           {quantize(q + " --batch-size 0"), "--batch-size"},
           {quantize(q + " --calib-count -5"), "--calib-count"},
           {profile + " --samples 0", "--samples"},
           {qat + " --lr 0", "--lr"},
           {qat + " --lr nan", "--lr"},
           {qat + " --lr inf", "--lr"},
           {quantize(q + " --device meta"), "--device"},
           {"quantize " + model_, "required"},
           {quantize(q + " --eval-labels " + kImages), "--eval-data"},
           {quantize(q + " --eval-outputs e.npy"), "--eval-data"},
           {profile + " -o ''", "names no file"},
           {profile + " -o " + work_.path().string() + "/", "names no file"},
           {"frobnicate", "subcommand"}}) {
    expect_one_line_error(run_cli(args), {flag});
  }
  // Global flags after the subcommand, and a thread count above the cores is cut to them.
  auto r = run_cli("inspect " + model_ + " -q --threads 1000000");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--threads 1000000: this machine has"), std::string::npos) << r.output;
  // NaN in a config is refused too.
  testing::write_text(config_, testing::read_text(config_) + "\n[qat]\nlr = nan\n");
  expect_one_line_error(run_cli(quantize(q)), {"lr", "finite"});
}

// Node names with ESC, CR, NUL and bytes that are not UTF-8 reach no file and no terminal raw:
// the node listing, the Graphviz and Mermaid drawings, the profile's HTML and the "wrote" line of
// an output path with the same bytes show them escaped.
TEST_F(Hardening, ControlBytesInNamesAreEscapedInEveryFileAndOnTheTerminal) {
  const std::string hostile = std::string("fc\x1b[31m\r", 8) + std::string(1, '\0') + "\xff\xfe_end";
  const std::string model = two_gemms("hostile.onnx", hostile, at::kFloat);
  const fs::path data = samples(at::kFloat);
  auto raw = [](const std::string& text) {
    return text.find('\x1b') != std::string::npos || text.find('\r') != std::string::npos ||
           text.find('\0') != std::string::npos || text.find('\xff') != std::string::npos;
  };
  const fs::path dot = work_.path() / "g.dot", mmd = work_.path() / "g.mmd";
  auto r = run_cli("inspect " + model + " --nodes --dot " + dot.string() + " --mermaid " + mmd.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(raw(r.output)) << r.output;
  EXPECT_NE(r.output.find("fc\\x1b[31m\\r\\x00\\xff\\xfe_end"), std::string::npos) << r.output;
  for (const auto& f : {dot, mmd}) {
    const std::string text = testing::read_text(f.string());
    EXPECT_FALSE(raw(text)) << f;
    EXPECT_NE(text.find("_end"), std::string::npos) << f;
  }
  fs::copy_file(testing::source_path("configs/w8a8_onnxruntime.toml"), config_, fs::copy_options::overwrite_existing);
  const fs::path prof = work_.path() / "p";
  r = run_cli("profile " + model + " -c " + config_ + " --calib " + data.string() + " -o " + prof.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string html = testing::read_text(prof.string() + ".html");
  EXPECT_FALSE(raw(html));
  EXPECT_NE(html.find("_end"), std::string::npos);
  // An output path with an escape sequence in it: written as named, echoed escaped.
  const std::string out = (work_.path() / "q\x1b[2J.onnx").string();
  r = run_cli("quantize " + model + " -c " + config_ + " --calib " + data.string() + " --no-latency -o '" + out + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out));
  EXPECT_FALSE(raw(r.output)) << r.output;
}

TEST_F(Hardening, UntrustedStringsAreBoundedAndEscapedInMessages) {
  testing::write_text(config_, "backend = \"" + std::string(50000, 'b') + "\"\n");
  auto r = run_cli(quantize("-o " + (work_.path() / "q.onnx").string()));
  expect_one_line_error(r, {"... (50000 characters)"});
  EXPECT_LT(r.output.size(), 1000u);
  testing::write_text(config_, "backend = \"evil\\u001b[31m\\nforged line\"\n");
  r = run_cli(quantize("-o " + (work_.path() / "q.onnx").string()));
  expect_one_line_error(r, {"evil\\x1b[31m\\nforged line"});
  EXPECT_EQ(r.output.find('\x1b'), std::string::npos);
  EXPECT_EQ(printable("a\nb\x1b"
                      "c\t",
                      200),
            "a\\nb\\x1bc\\t");
  EXPECT_EQ(printable(std::string(300, 'x'), 10), std::string(10, 'x') + "... (300 characters)");
}

void write_npy_header(const fs::path& path, const std::string& dict, char version = 1, std::size_t data_bytes = 0) {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string bytes("\x93NUMPY", 6);
  bytes += version;
  bytes += '\0';
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>(header.size() >> 8);
  if (version > 1) bytes += std::string(2, '\0');
  bytes += header + std::string(data_bytes, '\0');
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST_F(Hardening, NpyHeadersAreParsedStrictly) {
  const fs::path p = work_.path() / "x.npy";
  for (const auto& [dict, version, needle] : std::vector<std::tuple<std::string, char, std::string>>{
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (-4, -1, 28, 28), }", 1, "'-4'"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (4.0, 1, 28, 28), }", 1, "'4.0'"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (4,, 28), }", 1, "not a non-negative integer"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 1, 28, 28), }", 9, "version 9"},
           // What numpy's own reader refuses: a key twice, a fortran_order that is not a bool,
           // another key, a missing one, text after the dict.
           {"{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (4, 1, 28, 28), }", 1, "'descr' twice"},
           {"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (4, 1, 28, 28), }", 1, "neither True nor False"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 1, 28, 28), 'x': 1}", 1, "the key 'x'"},
           {"{'descr': '<f4', 'shape': (4, 1, 28, 28), }", 1, "no 'fortran_order'"},
           {"{'descr': '<f4', 'fortran_order': False, 'shape': (4, 1, 28, 28), } junk", 1, "more after its dict"}}) {
    write_npy_header(p, dict, version, 4 * 4 * 28 * 28);
    const std::string why = testing::error_of([&] { read_npy(p.string()); });
    EXPECT_NE(why.find("x.npy"), std::string::npos) << why;
    EXPECT_NE(why.find(needle), std::string::npos) << why;
  }
  write_npy_header(p, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1, 28, 28), }", 3, 4 * 2 * 28 * 28);
  EXPECT_EQ(read_npy(p.string()).sizes(), (std::vector<std::int64_t>{2, 1, 28, 28}));
  // A 0-d array for calibration: the file is named and the fix given.
  const fs::path dir = work_.path() / "scalar";
  fs::create_directories(dir);
  write_npy(at::scalar_tensor(1.0f), (dir / "s.npy").string());
  auto r = run_cli("quantize " + model_ + " -c " + config_ + " --calib " + dir.string() + " -o " +
                   (work_.path() / "q.onnx").string());
  expect_one_line_error(r, {"s.npy", "0-d array"});
}

TEST_F(Hardening, IdxSizesAreCheckedAgainstTheFileBeforeAllocating) {
  auto idx = [&](const std::string& name, std::vector<std::uint32_t> dims, std::size_t data) {
    std::string bytes = {0, 0, 0x08, static_cast<char>(dims.size())};
    for (auto d : dims)
      for (int s = 24; s >= 0; s -= 8) bytes += static_cast<char>((d >> s) & 0xff);
    bytes += std::string(data, '\0');
    const fs::path p = work_.path() / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  };
  const std::string q = " -o " + (work_.path() / "q.onnx").string();
  auto calib = [&](const std::string& path) {
    return "quantize " + model_ + " -c " + config_ + " --calib " + path + q;
  };
  expect_one_line_error(run_cli(calib(idx("short.idx", {60000, 28, 28}, 100))), {"short.idx", "declares"});
  expect_one_line_error(run_cli(calib(idx("huge.idx", {0xffffffffu, 0xffffffffu, 0xffffffffu}, 16))), {"huge.idx"});
  const auto r = run_cli(calib(idx("huge2.idx", {0xffffffffu, 0xffffffffu, 0xffffffffu}, 16)));
  EXPECT_EQ(r.output.find("c10"), std::string::npos) << r.output;
}

onnx::ModelProto fixture_proto() {
  onnx::ModelProto m;
  std::ifstream in(testing::fixture_model(), std::ios::binary);
  EXPECT_TRUE(m.ParseFromIstream(&in));
  return m;
}

TEST_F(Hardening, ModelsNewerThanTheExecutorOrInconsistentAreRefusedAtLoad) {
  auto refused = [&](onnx::ModelProto m) {
    const std::string path = (work_.path() / "bad.onnx").string();
    std::ofstream(path, std::ios::binary) << m.SerializeAsString();
    // The shipped plugins check their ops' nodes (a Conv's attributes against its weight).
    return testing::error_of([&] { load_onnx(path, ImportOptions{0, &testing::shipped_registry()}); });
  };
  onnx::ModelProto m = fixture_proto();
  m.mutable_opset_import(0)->set_version(99);
  EXPECT_NE(refused(m).find("opset 99 is newer"), std::string::npos) << refused(m);
  m = fixture_proto();
  m.set_ir_version(99);
  EXPECT_NE(refused(m).find("IR version 99"), std::string::npos) << refused(m);
  m = fixture_proto();
  for (auto& n : *m.mutable_graph()->mutable_node()) {
    if (n.op_type() != "Conv") continue;
    onnx::AttributeProto* a = nullptr;
    for (auto& existing : *n.mutable_attribute())
      if (existing.name() == "kernel_shape") a = &existing;
    if (!a) a = n.add_attribute();
    a->set_name("kernel_shape");
    a->set_type(onnx::AttributeProto::INTS);
    a->clear_ints();
    a->add_ints(7);
    a->add_ints(7);
    break;
  }
  std::string why = refused(m);
  EXPECT_NE(why.find("kernel_shape [7, 7] disagrees"), std::string::npos) << why;
  EXPECT_NE(why.find("(Conv)"), std::string::npos) << why;
  m = fixture_proto();
  m.mutable_graph()->mutable_output(0)->clear_type();
  why = refused(m);
  EXPECT_NE(why.find("graph output '"), std::string::npos) << why;
}

// Note [Declarations checked at import]: impossible dimensions and declarations that contradict
// each other are refused with the value named; -1, older exporters' open dimension, is read.
TEST_F(Hardening, DeclarationsThatContradictThemselvesAreRefusedAtLoad) {
  auto load = [&](const onnx::ModelProto& m) {
    const std::string path = (work_.path() / "declared.onnx").string();
    std::ofstream(path, std::ios::binary) << m.SerializeAsString();
    return testing::error_of([&] { load_onnx(path, ImportOptions{0, &testing::shipped_registry()}); });
  };
  onnx::ModelProto m = fixture_proto();
  const std::string input = m.graph().input(0).name();
  auto* dim =
      m.mutable_graph()->mutable_input(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(2);
  dim->set_dim_value(-5);
  std::string why = load(m);
  EXPECT_NE(why.find("graph input '" + input + "' declares dimension 2 as -5"), std::string::npos) << why;
  dim->set_dim_value(-1);  // read as open: loads
  const std::string path = (work_.path() / "open.onnx").string();
  std::ofstream(path, std::ios::binary) << m.SerializeAsString();
  EXPECT_NO_THROW(load_onnx(path, ImportOptions{0, &testing::shipped_registry()}));
  m = fixture_proto();
  auto* info = m.mutable_graph()->add_value_info();
  *info = m.graph().output(0);
  info->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::INT64);
  why = load(m);
  EXPECT_NE(why.find("value_info '" + m.graph().output(0).name() + "' contradicts its declaration as graph output"),
            std::string::npos)
      << why;
  // A fixed batch of 0 takes no sample: refused before calibrating, not fed batches of 1 to 4.
  m = fixture_proto();
  m.mutable_graph()
      ->mutable_input(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(0)
      ->set_dim_value(0);
  const std::string zero = (work_.path() / "zero_batch.onnx").string();
  std::ofstream(zero, std::ios::binary) << m.SerializeAsString();
  expect_one_line_error(run_cli("quantize " + zero + " -c " + config_ + " --calib " + kImages + " --calib-count 8 -o " +
                                (work_.path() / "q.onnx").string()),
                        {"declares a batch dimension of 0"});
}

// Note [Declared outputs]: what a model declares of an output against what its graph computes.
// Type, rank and tensor-or-sequence that differ are refused at the first run, naming the output
// (the export would be a file ONNX Runtime refuses); a fixed dimension that differs is warned of.
TEST_F(Hardening, DeclaredOutputsAreCheckedAgainstWhatTheGraphComputes) {
  const std::string out = (work_.path() / "q.onnx").string();
  auto quantize_proto = [&](const onnx::ModelProto& m) {
    const std::string path = (work_.path() / "declared.onnx").string();
    std::ofstream(path, std::ios::binary) << m.SerializeAsString();
    return run_cli("quantize " + path + " -c " + config_ + " --calib " + kImages + " --calib-count 8 -o " + out);
  };
  onnx::ModelProto m = fixture_proto();
  const std::string y = m.graph().output(0).name();
  auto* type = m.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type();
  type->set_elem_type(onnx::TensorProto::INT64);
  expect_one_line_error(quantize_proto(m), {"graph output '" + y + "' is declared int64", "the graph computes float [",
                                            "correct the declaration"});
  EXPECT_FALSE(fs::exists(out));

  type->set_elem_type(onnx::TensorProto::FLOAT);
  type->mutable_shape()->add_dim()->set_dim_value(1);  // [N, 10, 1]: a rank the graph does not compute
  expect_one_line_error(quantize_proto(m), {"graph output '" + y + "' is declared float [", ", 10, 1]",
                                            "the graph computes float [8, 10]"});
  EXPECT_FALSE(fs::exists(out));

  m = fixture_proto();
  m.mutable_graph()
      ->mutable_output(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim(1)
      ->set_dim_value(7);
  const auto r = quantize_proto(m);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(", 7], the graph computes float [8, 10] for this data"), std::string::npos) << r.output;
  fs::remove(out);

  // A sequence where the model declares a tensor.
  Graph g;
  g.opset_imports[""] = 13;
  g.inputs = {{"x", 1, true, {{-1, "N"}, {16, ""}}, ""}};
  g.outputs = {{"y", 1, true, {{-1, "N"}, {8, ""}}, ""}, {"s", 1, true, {{-1, "N"}, {16, ""}}, ""}};
  g.initializers["w"] = at::randn({8, 16});
  g.append(testing::make_node("fc", "Gemm", {"x", "w"}, {"y"}, {{"transB", Attribute::of_int(1)}}));
  g.append(testing::make_node("seq", "SequenceConstruct", {"x", "x"}, {"s"}));
  const std::string seq = (work_.path() / "seq.onnx").string();
  save_onnx(g, ModelMeta{}, seq);  // ONNX's checker lets it through
  expect_one_line_error(
      run_cli("quantize " + seq + " -c " + config_ + " --calib " + samples(at::kFloat).string() + " -o " + out),
      {"graph output 's' is declared a tensor (float [N, 16]) but the graph computes a sequence"});
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(Hardening, MessagesSayWhatIsWrongWhereItIs) {
  const std::string q = " -o " + (work_.path() / "q.onnx").string();
  expect_one_line_error(run_cli("quantize " + model_ + " -c " + config_ + " --calib /dev/zero" + q),
                        {"/dev/zero", "device, pipe"});
  expect_one_line_error(run_cli("quantize " + model_ + " -c . --calib " + kImages + q), {"is a folder"});
  // A text file named .so in a plugin folder.
  const fs::path plugins = work_.path() / "plugins";
  fs::create_directories(plugins);
  testing::write_text((plugins / "notes.so").string(), "not a library\n");
  auto r = testing::run_command("SPARSEBIT_PLUGIN_PATH=" + plugins.string() + " " + SPARSEBIT_CLI + " plugins");
  EXPECT_NE(r.output.find("no ELF header"), std::string::npos) << r.output;
}

TEST_F(Hardening, GlobsThatMatchNothingWarnAndInvalidGlobsFail) {
  const std::string base = testing::read_text(config_);
  testing::write_text(config_, "skip = [\"/nope/*\"]\n" + base);
  auto r = run_cli(quantize("-o " + (work_.path() / "q.onnx").string()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("skip glob '/nope/*' matches no node"), std::string::npos) << r.output;
  testing::write_text(config_, "skip = [\"[\"]\n" + base);
  expect_one_line_error(run_cli(quantize("-o " + (work_.path() / "q2.onnx").string())),
                        {"skip", "not a valid glob", "never closed"});
  testing::write_text(config_, base + "\n[[specific]]\nnodes = \"/fc9/*\"\nw = { observer = \"minmax\" }\n");
  r = run_cli(quantize("-o " + (work_.path() / "q3.onnx").string()));
  EXPECT_NE(r.output.find("[[specific]] #1 nodes glob '/fc9/*' matches no node"), std::string::npos) << r.output;
  // Thousands of them: ten named, one line for the rest (it was one line each).
  std::string many = "skip = [";
  for (int i = 0; i < 5000; ++i) many += "\"/none" + std::to_string(i) + "/*\", ";
  testing::write_text(config_, many + "]\n" + base);
  r = run_cli(quantize("-o " + (work_.path() / "q4.onnx").string()));
  EXPECT_EQ(r.exit_code, 0) << r.output.substr(0, 400);
  std::size_t named = 0;
  for (std::size_t at = 0; (at = r.output.find("matches no node", at)) != std::string::npos; ++at) ++named;
  EXPECT_EQ(named, 10u);
  EXPECT_NE(r.output.find("4990 more globs match no node"), std::string::npos) << r.output.substr(0, 400);
}

TEST_F(Hardening, LabelsThatAreNotLabelsAndQdqModelsAreRefused) {
  const std::string q = " -o " + (work_.path() / "q.onnx").string();
  const std::string eval = " --eval-data " + std::string(FASHION_MNIST_DIR) + "/t10k-images-idx3-ubyte.gz";
  expect_one_line_error(run_cli(quantize(q + eval + " --eval-labels " + kImages)),
                        {"not a label file", "[60000, 28, 28]"});
  // Labels of another task: class 250 for a 10-class model.
  std::string bytes = {0, 0, 0x08, 1, 0, 0, 0x27, 0x10};
  for (int i = 0; i < 10000; ++i) bytes += static_cast<char>(i % 2 ? 250 : 3);
  const std::string labels = (work_.path() / "labels.idx").string();
  std::ofstream(labels, std::ios::binary) << bytes;
  auto r = run_cli(quantize(q + eval + " --eval-labels " + labels));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("outside the model's 10 classes"), std::string::npos) << r.output;
  // The QDQ model just written cannot be quantized again.
  expect_one_line_error(run_cli("quantize " + (work_.path() / "q.onnx").string() + " -c " + config_ + " --calib " +
                                kImages + " -o " + (work_.path() / "qq.onnx").string()),
                        {"already quantized", "QuantizeLinear/DequantizeLinear"});
}

// A float model whose output is NaN on the calibration data: the bit allocation, which judges
// widths by the output error they add, refuses it by name (it used to index an empty choice and
// crash); the agreement check counts NaN instead of zeroing it into "cosine 1.0000" and says
// when nothing is left to compare.
TEST_F(Hardening, NanOutputsAreNeverJudgedAsAgreement) {
  auto model = [&](const std::string& name, bool all_nan) {
    Graph g;
    g.opset_imports[""] = 13;
    g.inputs = {{"x", 1, true, {{-1, "N"}, {16, ""}}, ""}};
    g.outputs = {{"y", 1, true, {{-1, "N"}, {8, ""}}, ""}};
    g.initializers["w"] = at::randn({8, 16});
    g.initializers["one"] = at::ones({});
    using testing::make_node;
    g.append(make_node("fc", "Gemm", {"x", "w"}, {"h"}, {{"transB", Attribute::of_int(1)}}));
    if (all_nan) {  // sqrt(-(|h| + 1)) everywhere
      g.append(make_node("abs", "Abs", {"h"}, {"a"}));
      g.append(make_node("add", "Add", {"a", "one"}, {"a1"}));
      g.append(make_node("neg", "Neg", {"a1"}, {"n"}));
      g.append(make_node("sqrt", "Sqrt", {"n"}, {"y"}));
    } else {  // sqrt of a Gemm's output: NaN wherever it is negative
      g.append(make_node("sqrt", "Sqrt", {"h"}, {"y"}));
    }
    const std::string path = (work_.path() / name).string();
    save_onnx(g, ModelMeta{}, path);
    return path;
  };
  const fs::path data = samples(at::kFloat);
  testing::write_text(config_, "backend = \"virtual\"\n[bit_allocation]\navg_weight_bits = 6\n");
  const std::string some_nan = model("some_nan.onnx", false), all_nan = model("all_nan.onnx", true);
  expect_one_line_error(run_cli("quantize " + some_nan + " -c " + config_ + " --calib " + data.string() + " -o " +
                                (work_.path() / "a.onnx").string()),
                        {"[bit_allocation]", "output 'y'", "NaN or infinite"});
  EXPECT_FALSE(fs::exists(work_.path() / "a.onnx"));

  fs::copy_file(testing::source_path("configs/w8a8_tensorrt.toml"), config_, fs::copy_options::overwrite_existing);
  const fs::path report = work_.path() / "r.json";
  auto r = run_cli("quantize " + all_nan + " -c " + config_ + " --calib " + data.string() + " -o " +
                   (work_.path() / "b.onnx").string() + " --report " + report.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("cosine 1.0000"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("no agreement can be measured"), std::string::npos) << r.output;
  const auto a = nlohmann::json::parse(testing::read_text(report.string())).at("agreement");
  EXPECT_TRUE(a.at("poor").get<bool>());
  EXPECT_TRUE(a.at("outputs")[0].at("cosine").is_null());
  EXPECT_EQ(a.at("outputs")[0].at("not_finite_float").get<std::int64_t>(), 4 * 8);

  r = run_cli("quantize " + some_nan + " -c " + config_ + " --calib " + data.string() + " -o " +
              (work_.path() / "c.onnx").string() + " --report " + report.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto b = nlohmann::json::parse(testing::read_text(report.string())).at("agreement").at("outputs")[0];
  const std::int64_t nan_float = b.at("not_finite_float").get<std::int64_t>();
  EXPECT_GT(nan_float, 0);
  EXPECT_LT(nan_float, 4 * 8);
  EXPECT_NE(r.output.find("NaN or infinite at " + std::to_string(nan_float) + " of its 32 values"), std::string::npos)
      << r.output;
}

// A model with a sequence output: calibration's output judgment (Note [Choices judged at the
// output]) and [bit_allocation] compare tensors only; a sequence is left out of the comparison
// instead of reaching LibTorch's "NestedTensorImpl doesn't support sizes".
TEST_F(Hardening, SequenceOutputsAreLeftOutOfEveryJudgment) {
  Graph g;
  g.opset_imports[""] = 13;
  g.inputs = {{"x", 1, true, {{-1, "N"}, {16, ""}}, ""}};
  g.outputs = {{"y", 1, true, {{-1, "N"}, {8, ""}}, ""}, {"s", 1, true, {{-1, "N"}, {16, ""}}, ""}};
  g.initializers["w"] = at::randn({8, 16});
  g.initializers["w2"] = at::randn({8, 8});
  g.append(testing::make_node("fc", "Gemm", {"x", "w"}, {"h"}, {{"transB", Attribute::of_int(1)}}));
  g.append(testing::make_node("relu", "Relu", {"h"}, {"r"}));
  g.append(testing::make_node("fc2", "Gemm", {"r", "w2"}, {"y"}, {{"transB", Attribute::of_int(1)}}));
  g.append(testing::make_node("seq", "SequenceConstruct", {"y", "h"}, {"s"}));
  const std::string path = (work_.path() / "seq.onnx").string();
  save_onnx(g, ModelMeta{}, path);
  onnx::ModelProto m;
  {
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(m.ParseFromIstream(&in));
  }
  auto* type = m.mutable_graph()->mutable_output(1)->mutable_type();
  type->Clear();
  type->mutable_sequence_type()->mutable_elem_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << m.SerializeAsString();

  const fs::path data = work_.path() / "many";  // more than range_samples: held-out samples judge
  fs::create_directories(data);
  at::manual_seed(3);  // heavy tails: the layers choose ranges of their own
  for (int i = 0; i < 24; ++i) write_npy(at::randn({16}).pow(3), (data / ("s" + std::to_string(i) + ".npy")).string());
  const std::string out = (work_.path() / "q.onnx").string();
  auto r = run_cli("quantize " + path + " -c " + config_ + " --calib " + data.string() + " -o " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ranges chosen by their layer's error"), std::string::npos) << r.output;
  testing::write_text(config_, "backend = \"virtual\"\n[bit_allocation]\navg_weight_bits = 6\n");
  r = run_cli("quantize " + path + " -c " + config_ + " --calib " + data.string() + " -o " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// Note [Half-precision models]: a float16 model is quantized (computed in float32 inside, where
// the Q/DQ pairs are) and its export still takes and gives float16 (it used to stop at
// "aminmax_cpu not implemented for 'Half'"). The reference is the same model and data widened
// to float32 and quantized the same way: ONNX Runtime runs both exports on one input, and the
// float16 export's outputs are the float32 export's rounded to float16.
TEST_F(Hardening, Float16ModelsAreQuantizedAndKeepTheirInputAndOutputTypes) {
  if (!SPARSEBIT_HAVE_ORT) GTEST_SKIP() << "ONNX Runtime not installed (npm ci --ignore-scripts in tests/ort)";
  at::manual_seed(7);
  const std::string half = two_gemms("half.onnx", "fc1", at::kHalf);
  const fs::path half_data = samples(at::kHalf), float_data = work_.path() / "data32";
  fs::create_directories(float_data);
  for (const auto& e : fs::directory_iterator(half_data))
    write_npy(read_npy(e.path().string()).to(at::kFloat), (float_data / e.path().filename()).string());
  Model widened = load_onnx(half);
  for (auto& kv : widened.graph.initializers) kv.second = kv.second.to(at::kFloat);
  widened.graph.inputs[0].elem_type = widened.graph.outputs[0].elem_type = 1;
  const std::string wide = (work_.path() / "float.onnx").string();
  save_onnx(widened.graph, ModelMeta{}, wide);

  const at::Tensor x = at::randn({32, 16}).to(at::kHalf);
  write_npy(x, (work_.path() / "x16.npy").string());
  write_npy(x.to(at::kFloat), (work_.path() / "x32.npy").string());
  auto ort = [&](const std::string& path, const std::string& in) {
    const std::string out = (work_.path() / "y.npy").string();
    const auto r = testing::run_command(std::string(SPARSEBIT_NODE) + " " + SPARSEBIT_ORT_DIR + "/run_model.mjs " +
                                        path + " --in x=" + (work_.path() / in).string() + " --out y=" + out);
    EXPECT_EQ(r.exit_code, 0) << path << "\n" << r.output;
    return r.exit_code == 0 ? read_npy(out) : at::Tensor();
  };
  for (const char* config : {"configs/w8a8_onnxruntime.toml", "configs/w8a8_tensorrt.toml"}) {
    SCOPED_TRACE(config);
    fs::copy_file(testing::source_path(config), config_, fs::copy_options::overwrite_existing);
    const std::string q16 = (work_.path() / "q16.onnx").string(), q32 = (work_.path() / "q32.onnx").string();
    auto r = run_cli("quantize " + half + " -c " + config_ + " --calib " + half_data.string() + " -o " + q16);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run_cli("quantize " + wide + " -c " + config_ + " --calib " + float_data.string() + " -o " + q32);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    onnx::ModelProto exported;
    std::ifstream in(q16, std::ios::binary);
    ASSERT_TRUE(exported.ParseFromIstream(&in));
    EXPECT_EQ(exported.graph().input(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT16);
    EXPECT_EQ(exported.graph().output(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT16);
    int quantize_linear = 0;
    for (const auto& n : exported.graph().node()) quantize_linear += n.op_type() == "QuantizeLinear";
    EXPECT_GE(quantize_linear, 2);  // both layers' inputs
    const at::Tensor y16 = ort(q16, "x16.npy");
    const at::Tensor y32 = ort(q32, "x32.npy");
    ASSERT_TRUE(y16.defined() && y32.defined());
    ASSERT_EQ(y16.scalar_type(), at::kHalf);
    // Rounding to float16 moves a value by at most half a unit in its last place (2^-11 relative).
    const at::Tensor bound = y32.abs() * std::ldexp(1.0, -11) + 1e-7;
    EXPECT_TRUE(((y16.to(at::kFloat) - y32).abs() <= bound).all().item<bool>())
        << (y16.to(at::kFloat) - y32).abs().max().item<float>();
  }
}

// A float64 model: ONNX's QuantizeLinear and DequantizeLinear take no float64, so its Q/DQ export
// would be a file no runtime loads (it used to be written, exit 0). Refused naming the node and
// the tensor, with the way out, and nothing written; with every config the same.
TEST_F(Hardening, Float64ModelsAreRefusedAtExportNotWrittenInvalid) {
  const std::string model = two_gemms("double.onnx", "fc1", at::kDouble);
  const fs::path data = samples(at::kDouble);
  for (const char* config : {"configs/w8a8_onnxruntime.toml", "configs/w8a8_tensorrt.toml"}) {
    fs::copy_file(testing::source_path(config), config_, fs::copy_options::overwrite_existing);
    const fs::path out = work_.path() / "q.onnx";
    expect_one_line_error(
        run_cli("quantize " + model + " -c " + config_ + " --calib " + data.string() + " -o " + out.string()),
        {"of node 'fc", "float64", "convert the model to float32"});
    EXPECT_FALSE(fs::exists(out)) << config;
  }
}

// Sizes a model computes at run time (Note [Memory limit]): each op below asks for about 10^12
// elements from a tiny file, more than any machine's memory. Every one is refused before it is
// allocated, naming the node and the limit's flag (they used to allocate until the machine ran
// out, or stop at a bare std::bad_alloc). A modest size passes the default limit and is refused
// under a lower --memory-limit, so the check is the limit and not a size rule.
TEST_F(Hardening, SizesComputedAtRunTimeAreCheckedAgainstTheMemoryLimitBeforeAllocation) {
  using testing::make_node;
  const std::int64_t M = 1000000;
  auto i64 = [](std::vector<std::int64_t> v) { return at::tensor(v, at::kLong); };
  struct Case {
    std::string op;
    std::int64_t opset;
    std::function<void(Graph&)> build;  // from h4 [N, 8, 1, 1] (or anything) to `big`
  };
  const std::vector<Case> cases = {
      {"ConstantOfShape", 13,
       [&](Graph& g) {
         g.initializers["shape"] = i64({M, M});
         g.append(make_node("huge", "ConstantOfShape", {"shape"}, {"big"}));
       }},
      {"Expand", 13,
       [&](Graph& g) {
         g.initializers["shape"] = i64({M, M, 1, 8, 1, 1});
         g.append(make_node("huge", "Expand", {"h4", "shape"}, {"e"}));
         g.append(make_node("after", "Relu", {"e"}, {"big"}));
       }},
      {"Tile", 13,
       [&](Graph& g) {
         g.initializers["repeats"] = i64({1, 1, M, M});
         g.append(make_node("huge", "Tile", {"h4", "repeats"}, {"big"}));
       }},
      {"Pad", 13,
       [&](Graph& g) {
         g.initializers["pads"] = i64({0, 0, M, M, 0, 0, M, M});
         g.append(make_node("huge", "Pad", {"h4", "pads"}, {"big"}));
       }},
      {"Resize", 13,
       [&](Graph& g) {
         g.initializers["scales"] = at::tensor({1.0f, 1.0f, 1e6f, 1e6f});
         g.append(make_node("huge", "Resize", {"h4", "", "scales"}, {"big"}));
       }},
      {"Upsample", 9,
       [&](Graph& g) {
         g.initializers["scales"] = at::tensor({1.0f, 1.0f, 1e6f, 1e6f});
         g.append(make_node("huge", "Upsample", {"h4", "scales"}, {"big"}));
       }},
      {"OneHot", 13,
       [&](Graph& g) {
         g.initializers["indices"] = i64({0, 1});
         g.initializers["depth"] = i64({M * M});
         g.initializers["values"] = at::tensor({0.0f, 1.0f});
         g.append(make_node("huge", "OneHot", {"indices", "depth", "values"}, {"big"}));
       }},
      {"ConvTranspose", 13,
       [&](Graph& g) {
         g.initializers["wt"] = at::randn({8, 1, 2, 2});
         g.append(
             make_node("huge", "ConvTranspose", {"h4", "wt"}, {"big"}, {{"dilations", Attribute::of_ints({M, M})}}));
       }},
      {"Conv", 13,
       [&](Graph& g) {
         g.initializers["wc"] = at::randn({1, 8, 1, 1});
         g.append(make_node("huge", "Conv", {"h4", "wc"}, {"big"}, {{"pads", Attribute::of_ints({M, M, M, M})}}));
       }},
  };
  const fs::path data = samples(at::kFloat);
  fs::copy_file(testing::source_path("configs/w8a8_onnxruntime.toml"), config_, fs::copy_options::overwrite_existing);
  auto model = [&](const Case& c) {
    Graph g;
    g.opset_imports[""] = c.opset;
    g.inputs = {{"x", 1, true, {{-1, "N"}, {16, ""}}, ""}};
    const bool two_dims = c.op == "ConstantOfShape" || c.op == "OneHot";
    const std::vector<Dim> big(two_dims ? 2 : c.op == "Expand" ? 6 : 4, Dim{-1, ""});
    g.outputs = {{"y", 1, true, {{-1, "N"}, {8, ""}}, ""}, {"big", 1, true, big, ""}};
    g.initializers["w"] = at::randn({8, 16});
    g.initializers["b"] = at::zeros({8});
    g.initializers["to4"] = i64({-1, 8, 1, 1});
    g.append(make_node("fc", "Gemm", {"x", "w", "b"}, {"y"}, {{"transB", Attribute::of_int(1)}}));
    g.append(make_node("to4", "Reshape", {"y", "to4"}, {"h4"}));
    c.build(g);
    const std::string path = (work_.path() / (c.op + ".onnx")).string();
    save_onnx(g, ModelMeta{}, path);
    return path;
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    const fs::path out = work_.path() / "q.onnx";
    const auto r =
        run_cli("quantize " + model(c) + " -c " + config_ + " --calib " + data.string() + " -o " + out.string());
    expect_one_line_error(r, {"node 'huge'", c.op, "memory limit", "--memory-limit", "GiB"});
    EXPECT_FALSE(fs::exists(out));
  }

  // 4096 x 4096 floats: 64 MiB, within any test machine's default limit, not within 16 MiB.
  const Case modest{"ConstantOfShape", 13, [&](Graph& g) {
                      g.initializers["shape"] = i64({4096, 4096});
                      g.append(make_node("huge", "ConstantOfShape", {"shape"}, {"big"}));
                    }};
  const std::string path = model(modest);
  const fs::path out = work_.path() / "q.onnx";
  auto r = run_cli("--memory-limit 16MiB quantize " + path + " -c " + config_ + " --calib " + data.string() + " -o " +
                   out.string());
  expect_one_line_error(r, {"node 'huge'", "64.0 MiB", "memory limit of 16.0 MiB", "--memory-limit"});
  EXPECT_FALSE(fs::exists(out));
  r = run_cli("quantize " + path + " -c " + config_ + " --calib " + data.string() + " -o " + out.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(out));

  expect_one_line_error(run_cli("--memory-limit 12parsecs quantize " + path + " -c " + config_ + " --calib " +
                                data.string() + " -o " + out.string()),
                        {"--memory-limit", "'12parsecs' is not a memory size"});
}

}  // namespace
}  // namespace sparsebit
