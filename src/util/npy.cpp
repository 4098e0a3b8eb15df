#include "sdxl/npy.h"

#include <cstring>
#include <string>

#include "sdxl/atomic_file.h"
#include "sdxl/error.h"

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

}  // namespace sdxl
