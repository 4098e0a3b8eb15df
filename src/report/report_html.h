// report.html: one self-contained page (inline CSS and SVG, thumbnails as
// data: URIs, no script, no network) summarising a batch run from its
// report.json: header with counts and rates, contact sheet, stage timeline,
// memory chart and failures table. Every string from the report is
// HTML-escaped. Missing keys or wrong types in the report never throw, nor
// does a missing or unreadable PNG (it shows as a grey "missing" card); only
// writing the page itself throws (IoError naming the path). The page's size is
// bounded by the report's: the charts draw at most 24 grid lines, and times
// over a year (or not finite) are not plotted. Thread-safe (no shared state).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace sdxl {

// Longest side of a contact-sheet thumbnail; smaller images are not enlarged.
inline constexpr int kThumbnailMaxSide = 192;

// Standard base64 (RFC 4648 section 4) with '=' padding.
std::string base64_encode(std::span<const std::uint8_t> data);

// The page as a string. thumbnail_data_uris holds one "data:image/png;base64,..."
// per report["images"] entry, "" where the file is missing; a shorter vector
// counts as "" for the rest.
std::string render_report_html(const nlohmann::json& report, const std::vector<std::string>& thumbnail_data_uris);

// Reads out_dir/<images[i].file>, makes PNG thumbnails, renders, and writes
// out_dir/<file_name> atomically. A thumbnail is made only from a regular file
// inside out_dir once links are resolved, of at most 256 MiB and within the
// input images' pixel limit (image/png_reader.h), as every input is read: a
// report names any path, and its folder may be shared. An image no larger
// than a thumbnail is embedded as it is, its critical chunks only (no text
// chunks). The page is written in pieces (core/atomic_stream.h): it is never
// held whole in memory.
void write_report_html(const std::filesystem::path& out_dir, const nlohmann::json& report,
                       const std::string& file_name = "report.html");

}  // namespace sdxl
