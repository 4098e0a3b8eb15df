#include "core/npy.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "core/atomic_file.h"
#include "core/error.h"

namespace sdxl {

void write_npy_f32(const std::filesystem::path& path, const std::vector<std::int64_t>& shape,
                   const std::vector<float>& data) {
  std::int64_t n = 1;
  std::string dims;
  for (auto d : shape) {
    n *= d;
    dims += std::to_string(d) + ",";
  }
  if (n != static_cast<std::int64_t>(data.size()))
    throw IoError("npy '" + path.string() + "': shape does not match the data size");
  if (shape.size() > 1) dims.pop_back();  // (4,) keeps its comma, (1,4) does not
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // magic(6) + version(2) + header_len(2) + header, padded with spaces to 64, ends with \n.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header.size() & 0xff));
  out.push_back(static_cast<char>(header.size() >> 8));
  out += header;
  const size_t off = out.size();
  out.resize(off + data.size() * sizeof(float));
  std::memcpy(out.data() + off, data.data(), data.size() * sizeof(float));  // little-endian host (x86-64)
  write_file_atomic(path, out);
}

std::vector<float> read_npy_f32(const std::filesystem::path& path, std::vector<std::int64_t>* shape) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open '" + path.string() + "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto fail = [&](const std::string& why) -> IoError { return IoError("'" + path.string() + "' " + why); };
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) throw fail("is not a .npy file");
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t header_len = 0, off = 0;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
    off = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw fail("is truncated");
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    off = 12;
  } else {
    throw fail("has an unknown .npy version");
  }
  if (bytes.size() < off + header_len) throw fail("is truncated");
  const std::string header = bytes.substr(off, header_len);
  if (header.find("'descr': '<f4'") == std::string::npos) throw fail("is not little-endian float32");
  if (header.find("'fortran_order': False") == std::string::npos) throw fail("is in Fortran order");
  const size_t lp = header.find('(', header.find("'shape'")), rp = header.find(')', lp);
  if (lp == std::string::npos || rp == std::string::npos) throw fail("has no shape");
  std::vector<std::int64_t> dims;
  std::int64_t n = 1;
  std::string num;
  for (size_t i = lp + 1; i <= rp; ++i) {
    const char c = header[i];
    if (c >= '0' && c <= '9') {
      num.push_back(c);
      if (num.size() > 12) throw fail("has a shape beyond any file's size");
    } else if (!num.empty()) {
      dims.push_back(std::stoll(num));
      if (dims.back() > 0 && n > static_cast<std::int64_t>(bytes.size()) / dims.back())
        throw fail("has a shape beyond its file's size");
      n *= dims.back();
      num.clear();
    }
  }
  const size_t data_off = off + header_len;
  if (bytes.size() - data_off != static_cast<size_t>(n) * sizeof(float)) throw fail("has a data size that does not match its shape");
  std::vector<float> data(static_cast<size_t>(n));
  std::memcpy(data.data(), bytes.data() + data_off, data.size() * sizeof(float));
  if (shape) *shape = dims;
  return data;
}

}  // namespace sdxl
