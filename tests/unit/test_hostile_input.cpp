// Hostile inputs of issue 46, each test with the rule it checks: reads that
// follow links out of their folder, two images with one output path,
// exponential wildcards and their budget, text that is not UTF-8 or holds
// control characters, and validate = run (PNGs decoded whole, embeddings
// checked as the run loads them, prompt tags' LoRAs resolved).
// tests/e2e/test_hostile_input.py runs the same cases through the real binary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "batch/batch_file.h"
#include "batch/generation_params.h"
#include "batch/manifest.h"
#include "batch/output_names.h"
#include "batch/wildcards.h"
#include "check/batch_check.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/input_text.h"
#include "core/npy.h"
#include "image/png_reader.h"
#include "image/png_writer.h"
#include "lora/embedding_files.h"
#include "lora/safetensors.h"

#include "test_support.h"

namespace fs = std::filesystem;

namespace {

using sdxl::testing::slurp;
using sdxl::testing::TempDir;
using sdxl::testing::error_of;
using sdxl::testing::spit;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<sdxl::BatchProblem> parse_problems(const std::string& text, const fs::path& origin) {
  std::vector<sdxl::BatchProblem> p;
  sdxl::parse_batch_text(text, origin, {}, &p);
  return p;
}

}  // namespace

// Rule: a file named relative to a folder is read only inside it; links inside to inside are followed.
TEST(HostileInput, ConfinedReadsRefuseLinksOutOfTheFolder) {
  TempDir d("confined");
  fs::create_directories(d.root / "lib" / "real");
  fs::create_directories(d.root / "elsewhere");
  spit(d.root / "elsewhere" / "secret.txt", "secret\n");
  spit(d.root / "lib" / "real" / "ok.txt", "ok\n");
  fs::create_symlink(d.root / "elsewhere" / "secret.txt", d.root / "lib" / "file-link.txt");
  fs::create_symlink(d.root / "elsewhere", d.root / "lib" / "dir-link");
  fs::create_symlink("real/ok.txt", d.root / "lib" / "inside-link.txt");
  const fs::path lib = d.root / "lib";
  for (const fs::path& p : {lib / "file-link.txt", lib / "dir-link" / "secret.txt"}) {
    const std::string why = error_of([&] { sdxl::read_input_file(p, "wildcard file", 1 << 20, lib); });
    EXPECT_TRUE(has(why, "leads out of its folder")) << p << ": " << why;
    EXPECT_FALSE(has(why, "secret\n"));
  }
  EXPECT_EQ(sdxl::read_input_file(lib / "inside-link.txt", "wildcard file", 1 << 20, lib), "ok\n");
  EXPECT_EQ(sdxl::read_input_file(lib / "real" / "ok.txt", "wildcard file", 1 << 20, lib), "ok\n");
  // The folder itself may be a link: it is where the user pointed.
  fs::create_symlink(lib, d.root / "lib-link");
  EXPECT_EQ(sdxl::read_input_file(d.root / "lib-link" / "real" / "ok.txt", "f", 1 << 20, d.root / "lib-link"), "ok\n");
  EXPECT_TRUE(sdxl::outside_folder_problem(lib / "dir-link" / "secret.txt", lib).size() > 0);
  EXPECT_EQ(sdxl::outside_folder_problem(lib / "missing.txt", lib), "");
}

// Rule: wildcard files and sub-folders that link out of the wildcards folder are refused, not read.
TEST(HostileInput, WildcardLinksOutOfTheirFolderAreRefused) {
  TempDir d("wild-links");
  fs::create_directories(d.root / "w");
  fs::create_directories(d.root / "elsewhere");
  spit(d.root / "elsewhere" / "pw.txt", "root:x:0:0\n");
  spit(d.root / "w" / "colors.txt", "red\n");
  fs::create_symlink(d.root / "elsewhere" / "pw.txt", d.root / "w" / "pw.txt");
  fs::create_symlink(d.root / "elsewhere", d.root / "w" / "sub");
  fs::create_symlink("colors.txt", d.root / "w" / "hues.txt");
  const sdxl::WildcardLibrary lib({d.root / "w"});
  for (const std::string t : {"__pw__", "__sub/pw__"}) {
    const std::string why = error_of([&] { sdxl::check_template(t, lib); });
    EXPECT_TRUE(has(why, "leads out of its folder")) << t << ": " << why;
    EXPECT_FALSE(has(why, "root:x"));
  }
  EXPECT_EQ(sdxl::expand_random("__hues__", 1, lib).text, "red");
}

// Rule: no two images of a batch file have one output path, seeds known or drawn at run time.
TEST(HostileInput, OutputNameCollisionsNameBothTasks) {
  auto task = [](const std::string& id, std::int64_t seed, int count, bool random = false) {
    sdxl::BatchTask t;
    t.id = id;
    t.params.seed = seed;
    t.count = count;
    t.seed_random = random;
    return t;
  };
  const std::vector<std::string> ptrs{"/tasks/0", "/tasks/1"};
  const std::string dflt = sdxl::kDefaultNameTemplate;
  const std::vector<std::pair<std::string, std::string>> same{{"a b", "a_b"}, {".x", "_.x"}, {"A", "a"}};
  for (const auto& [a, b] : same) {
    const auto p = sdxl::output_name_collisions({task(a, 3, 2), task(b, 3, 2)}, ptrs, dflt);
    ASSERT_EQ(p.size(), 1u) << a << " / " << b;
    EXPECT_EQ(p[0].pointer, "/tasks/1/id");
    EXPECT_TRUE(has(p[0].message, "(/tasks/0)")) << p[0].message;
  }
  EXPECT_TRUE(sdxl::output_name_collisions({task("a b", 3, 2), task("a_b", 10, 2)}, ptrs, dflt).empty());
  EXPECT_EQ(sdxl::output_name_collisions({task("a", 3, 2), task("b", 4, 2)}, ptrs, "{seed}.png").size(), 1u)
      << "a#1 and b#0 both have seed 4";
  EXPECT_EQ(sdxl::output_name_collisions({task("a", 3, 2), task("b", 30, 2)}, ptrs, "{index}.png").size(), 1u);
  // Random seeds: names that differ only in the seed may meet.
  const auto r = sdxl::output_name_collisions({task("a", 0, 2, true), task("b", 9, 1)}, ptrs, "{seed}.png");
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(has(r[0].message, "drawn at run time")) << r[0].message;
  EXPECT_EQ(sdxl::output_name_collisions({task("a", 0, 2, true), task("b", 9, 1)}, ptrs, "{index}{seed}.png").size(),
            1u);
  EXPECT_EQ(sdxl::output_name_collisions({task("a b", 0, 2, true), task("a_b", 0, 1, true)}, ptrs, dflt).size(), 1u);
  EXPECT_TRUE(sdxl::output_name_collisions({task("p01", 0, 5, true), task("p02", 0, 5, true)}, ptrs, dflt).empty());
  EXPECT_TRUE(sdxl::output_name_collisions({task("a", 0, 5, true), task("b", 0, 5)}, ptrs, "{id}/{seed}.png").empty());
}

// Rule: parse (validate and run) reports a collision with its pointer, over all tasks (before any shard).
TEST(HostileInput, BatchFileWithCollidingIdsIsInvalid) {
  const auto p = parse_problems(
      R"({"version": 1, "tasks": [{"id": "a b", "prompt": "x", "seed": 1, "count": 3},
                                  {"id": "a_b", "prompt": "y", "seed": 1, "count": 3}]})",
      "b.json");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].pointer, "/tasks/1/id");
  EXPECT_TRUE(has(p[0].message, "a_b-0-1.png")) << p[0].message;
}

// Rule: an empty file or folder name is a problem at its pointer, never an exception, also for a
// batch file named without a folder (fuzz_batch_file found `"model": ""` ending the process).
TEST(HostileInput, EmptyPathsAreProblemsAtTheirPointers) {
  const auto p = parse_problems(
      R"({"version": 1, "defaults": {"vae": "", "mask": "", "upscale": {"model": "", "scale": 2}},
          "tasks": [{"id": "t", "prompt": "a", "init_image": "", "hires": {"scale": 2, "upscaler": ""},
                     "detailer": [{"detector": ""}], "controlnets": [{"model": "", "image": ""}],
                     "ip_adapter": {"model": "", "images": [""]}}]})",
      "b.json");
  std::set<std::string> pointers;
  for (const auto& q : p) pointers.insert(q.pointer);
  for (const char* want : {"/defaults/vae", "/defaults/mask", "/defaults/upscale/model", "/tasks/0/init_image",
                           "/tasks/0/hires/upscaler", "/tasks/0/detailer/0/detector", "/tasks/0/controlnets/0/model",
                           "/tasks/0/controlnets/0/image", "/tasks/0/ip_adapter/model", "/tasks/0/ip_adapter/images/0"})
    EXPECT_TRUE(pointers.count(want)) << want;
  for (const auto& q : p) {
    if (q.pointer == "/tasks/0/ip_adapter/images/0") continue;
    EXPECT_TRUE(has(q.message, "must not be empty")) << q.pointer << ": " << q.message;
  }
}

// Rule: a .npy whose shape is beyond its file's size is an IoError naming the file (no overflow, no
// std::out_of_range from the digits).
TEST(HostileInput, NpyShapesBeyondTheFileAreRefused) {
  TempDir d("npy");
  const auto npy = [&](const std::string& name, const std::string& shape) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + shape + "), }";
    header.resize(118, ' ');
    header += '\n';
    std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(header.size()) + '\0' + header;
    bytes += std::string(8, '\0');  // two floats
    spit(d.root / name, bytes);
    return d.root / name;
  };
  EXPECT_EQ(sdxl::read_npy_f32(npy("ok.npy", "1, 2"), nullptr).size(), 2u);
  for (const char* shape : {"99999999999999999999999,", "4294967296, 4294967296, 4294967296", "3, 1"}) {
    const std::string e = error_of([&] { sdxl::read_npy_f32(npy("bad.npy", shape), nullptr); });
    EXPECT_TRUE(has(e, "bad.npy") && (has(e, "shape") || has(e, "size"))) << shape << ": " << e;
  }
}

// Rule: an exponential chain of wildcard files is refused at once, naming the chain; expansion stops at the budget.
TEST(HostileInput, ExponentialWildcardsAreRefusedQuickly) {
  TempDir d("exp");
  for (int i = 0; i < 40; ++i)
    spit(d.root / ("w" + std::to_string(i) + ".txt"),
         "__w" + std::to_string(i + 1) + "__ __w" + std::to_string(i + 1) + "__\n");
  spit(d.root / "w40.txt", "x\n");
  const sdxl::WildcardLibrary lib({d.root});
  const auto t0 = std::chrono::steady_clock::now();
  const std::string why = error_of([&] { sdxl::check_template("__w0__", lib); });
  EXPECT_TRUE(has(why, "beyond the budget")) << why;
  EXPECT_TRUE(has(why, "w0.txt")) << why;
  EXPECT_TRUE(has(error_of([&] { sdxl::expand_random("__w0__", 1, lib); }), "beyond the budget"));
  EXPECT_TRUE(has(error_of([&] { sdxl::expand_combination("__w0__", 0, lib); }), "beyond the budget"));
  // Without the budget 40 levels make 2^40 copies (24 levels took 3.9 s); with it, about a second
  // (the expansions run up to a million steps), more on a loaded machine.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  // 15 levels (32768 x's) stay within the budget.
  EXPECT_EQ(sdxl::expand_random("__w25__", 1, lib).text.size(), 2u * 32768 - 1);
}

// Rule: a wildcard file is read and parsed once per process, however many libraries and images use it.
TEST(HostileInput, WildcardFilesAreParsedOnce) {
  TempDir d("once");
  std::string big;
  for (int k = 0; k < 50000; ++k) big += "v" + std::to_string(k) + " {a|b}\n";
  spit(d.root / "big.txt", big);
  const sdxl::WildcardLibrary one({d.root}), two({d.root});
  EXPECT_EQ(&one.file("big"), &two.file("big"));
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t seed = 0; seed < 2000; ++seed) (void)sdxl::expand_random("__big__", seed, one);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "2000 images: no parse per image";
}

// Rule: wildcard values are UTF-8 without control characters (a tab allowed); the error names file and line.
TEST(HostileInput, WildcardTextMustBeUtf8WithoutControls) {
  TempDir d("text");
  spit(d.root / "latin.txt", "ok\ncaf\xe9\n");
  spit(d.root / "sep.txt", "lake\x1enegative\n");
  spit(d.root / "nul.txt", std::string("a\0b\n", 4));
  spit(d.root / "tab.txt", "a\tb\n");
  const sdxl::WildcardLibrary lib({d.root});
  EXPECT_TRUE(has(error_of([&] { sdxl::check_template("__latin__", lib); }), "latin.txt' line 2 is not UTF-8"));
  EXPECT_TRUE(has(error_of([&] { sdxl::check_template("__sep__", lib); }), "U+001E"));
  EXPECT_TRUE(has(error_of([&] { sdxl::check_template("__nul__", lib); }), "U+0000"));
  EXPECT_EQ(sdxl::expand_random("__tab__", 1, lib).text, "a\tb");
}

// Rule: batch-file strings: prompts may hold line breaks and tabs; other strings and keys no control character.
TEST(HostileInput, BatchStringsFollowTheTextRule) {
  auto problems = parse_problems(
      R"({"version": 1, "tasks": [{"id": "a", "prompt": "one\ntwo\tthree", "negative": "x\u001ey", "seed": 1},
                                  {"id": "b\nc", "prompt": "x", "sampler": "Euler\u0000", "seed": 2}]})",
      "b.json");
  std::vector<std::string> ptrs;  // the sampler is also unknown: its pointer comes twice
  for (const auto& p : problems)
    if (ptrs.empty() || ptrs.back() != p.pointer) ptrs.push_back(p.pointer);
  EXPECT_EQ(ptrs, (std::vector<std::string>{"/tasks/0/negative", "/tasks/1/id", "/tasks/1/sampler"}));
  EXPECT_TRUE(has(problems[0].message, "U+001E"));
  EXPECT_TRUE(has(problems[1].message, "line break"));
  EXPECT_EQ(sdxl::text_problem("caf\xc3\xa9", sdxl::TextKind::kName), "");
  EXPECT_TRUE(has(sdxl::text_problem("\xc0\xaf", sdxl::TextKind::kName), "not UTF-8 at byte 1"));  // overlong '/'
  EXPECT_TRUE(has(sdxl::text_problem("\xed\xa0\x80", sdxl::TextKind::kMultiline), "not UTF-8"));  // a surrogate
  EXPECT_TRUE(has(sdxl::text_problem("a\xc2\x85", sdxl::TextKind::kMultiline), "U+0085"));       // C1 next line
}

// Rule: PNG metadata never carries a raw control character: names are one line, a NUL never ends a chunk.
TEST(HostileInput, PngMetadataCarriesNoControlCharacters) {
  sdxl::GenerationParams p;
  p.prompt = "a cat\non two lines";
  p.controlnets.push_back({});
  sdxl::ImageSources src;
  src.model_name = "m";
  src.controlnets = {{"pose\nSteps: 999, Seed: 1", ""}};
  const std::string params = sdxl::a1111_parameters(p, src);
  std::istringstream lines(params);
  std::string line;
  int steps_lines = 0;
  while (std::getline(lines, line)) steps_lines += line.rfind("Steps: ", 0) == 0;
  EXPECT_EQ(steps_lines, 1) << params;
  EXPECT_TRUE(has(params, "a cat\non two lines\n"));

  TempDir d("png");
  const std::uint8_t px[3] = {1, 2, 3};
  sdxl::write_png(d.root / "x.png", 1, 1, 3, px, {{"parameters", std::string("a\0b\x1e" "c\xff", 6)}});
  const sdxl::PngText back = sdxl::read_png_text(d.root / "x.png");
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].second, "a b c\xef\xbf\xbd");
}

// Rule: a manifest line is written even when a value is not UTF-8 (U+FFFD), never failing after the PNG exists.
TEST(HostileInput, ManifestLineSurvivesBadBytes) {
  TempDir d("manifest");
  sdxl::ManifestEntry e;
  e.task = "a";
  e.file = "a.png";
  e.params.prompt = "caf\xe9";
  {
    sdxl::Manifest m(d.root / "manifest.jsonl");
    EXPECT_EQ(error_of([&] { m.append(e); }), "");
  }
  EXPECT_TRUE(has(slurp(d.root / "manifest.jsonl"), "caf\xef\xbf\xbd"));
}

namespace {

// The problems check/ finds in a batch file's text without a model (`origin` names it).
std::vector<sdxl::BatchProblem> check_problems(const std::string& text, const fs::path& origin,
                                               const std::vector<fs::path>& lora_dirs = {}) {
  sdxl::BatchCheckInputs in;
  in.lora_dirs = lora_dirs;
  return sdxl::check_batch_text(text, origin, nullptr, in).problems;
}

// A safetensors image of clip_l [1, wl] and clip_g [1, wg], both of `dtype`
// (2- or 4-byte elements), with `bits` as clip_g's first element.
sdxl::SafetensorsFile embedding(const std::string& dtype, int wl, int wg, std::uint32_t bits = 0) {
  const size_t es = dtype == "F32" || dtype == "I32" ? 4 : 2;
  const size_t nl = es * static_cast<size_t>(wl), ng = es * static_cast<size_t>(wg);
  std::string header = R"({"clip_l":{"dtype":")" + dtype + R"(","shape":[1,)" + std::to_string(wl) +
                       R"(],"data_offsets":[0,)" + std::to_string(nl) + R"(]},"clip_g":{"dtype":")" + dtype +
                       R"(","shape":[1,)" + std::to_string(wg) + R"(],"data_offsets":[)" + std::to_string(nl) + "," +
                       std::to_string(nl + ng) + "]}}";
  std::vector<std::uint8_t> bytes(8 + header.size() + nl + ng, 0);
  const std::uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  std::memcpy(bytes.data() + 8, header.data(), header.size());
  std::memcpy(bytes.data() + 8 + header.size() + nl, &bits, es);  // little-endian: the low bytes for 2-byte types
  return sdxl::SafetensorsFile::from_bytes(std::move(bytes), "emb/inkstyle.safetensors");
}

}  // namespace

// Rule (validate = run): an image a task names is decoded whole by the run's reader at check time.
TEST(HostileInput, TruncatedAndOversizedPngsAreRefusedAtCheck) {
  TempDir t("h46-png");
  const std::vector<std::uint8_t> grey(64 * 64 * 3, 128);
  sdxl::write_png(t.root / "good.png", 64, 64, 3, grey.data(), {});
  const std::string whole = slurp(t.root / "good.png");
  spit(t.root / "cut.png", whole.substr(0, whole.size() - 40));
  int w = 0, h = 0;
  EXPECT_EQ(sdxl::png_size((t.root / "cut.png").string(), w, h), "") << "the header alone reads fine";
  const std::string text = R"({"version": 1, "tasks": [{"id": "ok", "prompt": "x", "init_image": "good.png"},
      {"id": "bad", "prompt": "x", "init_image": "cut.png"}]})";
  const auto p = check_problems(text, t.root / "b.json");
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].pointer, "/tasks/1/init_image");
  EXPECT_TRUE(has(p[0].message, "cut.png' is not a readable PNG")) << p[0].message;
  std::string big = whole;  // IHDR says 20000 x 16000: refused from the header, before any decoding
  const unsigned char dims[8] = {0, 0, 0x4e, 0x20, 0, 0, 0x3e, 0x80};
  big.replace(16, 8, reinterpret_cast<const char*>(dims), 8);
  spit(t.root / "big.png", big);
  EXPECT_TRUE(has(sdxl::png_decode_problem(t.root / "big.png", w, h), "more than the 268435456 pixels"));
  EXPECT_TRUE(has(error_of([&] { (void)sdxl::read_png_rgb(t.root / "big.png"); }), "more than the 268435456 pixels"))
      << "the run's reader holds the same limit";
}

// Rule (validate = run): an embedding's vectors are checked without torch as load_embeddings checks them.
TEST(HostileInput, EmbeddingVectorsAreCheckedAsTheRunLoadsThem) {
  EXPECT_EQ(error_of([] { sdxl::check_embedding_vectors(embedding("F16", 4, 6), 4, 6); }), "");
  EXPECT_TRUE(has(error_of([] { sdxl::check_embedding_vectors(embedding("F16", 5, 6), 4, 6); }),
                  "'clip_l' has shape [1, 5], this model needs [n, 4]"));
  EXPECT_TRUE(has(error_of([] { sdxl::check_embedding_vectors(embedding("I32", 4, 6), 4, 6); }),
                  "tensor 'clip_l' has dtype I32"));
  EXPECT_TRUE(has(error_of([] { sdxl::check_embedding_vectors(embedding("F16", 4, 6, 0x7E00), 4, 6); }),
                  "'clip_g' contains NaN or Inf"));
  EXPECT_TRUE(has(error_of([] { sdxl::check_embedding_vectors(embedding("BF16", 4, 6, 0xFF80), 4, 6); }),
                  "'clip_g' contains NaN or Inf"));
  EXPECT_TRUE(has(error_of([] { sdxl::check_embedding_vectors(embedding("F32", 4, 6, 0x7F800000), 0, 0); }),
                  "emb/inkstyle.safetensors"));
}

// Rule (validate = run): a prompt tag's LoRA is resolved at check time, as the run resolves it.
TEST(HostileInput, PromptTagLorasAreResolvedAtCheck) {
  TempDir t("h46-lora");
  fs::create_directories(t.root / "loras");
  spit(t.root / "loras" / "ink.safetensors", "");
  const std::string text = R"({"version": 1, "tasks": [{"id": "ok", "prompt": "x <lora:ink:0.5>"},
      {"id": "bad", "prompt": "x <lora:nosuch:0.5>"}]})";
  const auto p = check_problems(text, t.root / "b.json", {t.root / "loras"});
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].pointer, "/tasks/1/prompt");
  EXPECT_TRUE(has(p[0].message, "LoRA 'nosuch'")) << p[0].message;
  EXPECT_EQ(check_problems(text, t.root / "b.json").size(), 2u) << "without the --lora-dir neither resolves";
}

// Rule (validate = run): A1111 prompt editing is read at check time as the run reads it: a
// "[from:to:when]" whose `when` is no number, or a `when` beyond any step (A1111's int() fails),
// is a problem at the prompt's or negative prompt's pointer (the negative only with CFG, as the
// run encodes it); edits A1111 reads as text pass.
TEST(HostileInput, PromptEditsWithBadWhenAreProblemsAtTheirPointers) {
  TempDir t("h61-edit");
  const std::string text = R"({"version": 1, "tasks": [
      {"id": "ok", "prompt": "a [cat:dog:0.5] [red|blue] [note: text] x | y", "negative": "[blurry::4]"},
      {"id": "bad-when", "prompt": "a [cat:dog:abc] on a sofa"},
      {"id": "bad-negative", "prompt": "x", "negative": "[blurry:lowres:1e999]"},
      {"id": "no-cfg", "prompt": "x", "cfg": 1, "negative": "[blurry:lowres:zz]"}]})";
  const auto p = check_problems(text, t.root / "b.json");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].pointer, "/tasks/1/prompt");
  EXPECT_TRUE(has(p[0].message, "when 'abc' is not a number")) << p[0].message;
  EXPECT_EQ(p[1].pointer, "/tasks/2/negative");
  EXPECT_TRUE(has(p[1].message, "beyond any step")) << p[1].message;
}
