#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"

namespace fs = std::filesystem;

TEST(AtomicFile, ReplacesWholeFileAndLeavesNoTemporary) {
  const auto dir = fs::temp_directory_path() / ("sdxl_atomic_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  sdxl::write_file_atomic(dir / "x.txt", std::string_view("first version"));
  sdxl::write_file_atomic(dir / "x.txt", std::string_view("second"));
  std::ifstream in(dir / "x.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), "second");
  int entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1) << "a temporary file was left behind";
}

TEST(AtomicFile, MissingFolderIsAnIoErrorNamingThePath) {
  try {
    sdxl::write_file_atomic("/nonexistent-folder-sdxl/x.png", std::string_view("x"));
    FAIL();
  } catch (const sdxl::IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-folder-sdxl/"), std::string::npos) << e.what();
  }
}
