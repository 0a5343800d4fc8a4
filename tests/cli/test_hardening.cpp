// Adversarial use of the command line: every case reproduces a way a user's files were lost, a
// run hung, or a message misled, and checks the fixed behaviour (the input readers and models:
// test_hardening_models.cpp, test_hardening_numbers.cpp).

#include "hardening_fixture.h"

namespace sparsebit::hardening {
namespace {

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

}  // namespace
}  // namespace sparsebit::hardening
