// Text that comes from outside (batch-file strings, wildcard lines, names in
// model.json, file names) and text that goes into PNG metadata. torch-free.
//
// Input rule: text is UTF-8 (no overlong forms, no surrogates, nothing past
// U+10FFFF) without control characters: C0 (U+0000-U+001F), DEL (U+007F) and
// C1 (U+0080-U+009F). A tab is allowed in free text (prompts, wildcard
// values); a newline only where a field's format allows one (prompts and
// negatives: A1111 prompts may span lines). Everything else (ids, names,
// paths, sampler names, ...) is one line without either.
//
// Output rule: PNG metadata never carries a raw control character or a byte
// that is not UTF-8, whatever its source (clean_metadata_text), as a last line
// of defence behind the input rule.
#pragma once

#include <string>
#include <string_view>

namespace sdxl {

enum class TextKind {
  kName,       // one line: no control character at all
  kLine,       // free text on one line: tab allowed (a wildcard value)
  kMultiline,  // free text: tab and newline allowed (a prompt, a negative)
};

// Why `text` breaks the input rule for `kind` ("is not UTF-8 at byte 7",
// "has a control character (U+001E) at byte 12"), or "" when it is fine.
// Byte positions are 1-based.
std::string text_problem(std::string_view text, TextKind kind);

// `text` with every control character replaced by a space (a newline kept when
// `keep_newlines`; "\r\n" and a lone '\r' become '\n' then) and every byte
// that is not part of valid UTF-8 replaced by U+FFFD.
std::string clean_metadata_text(std::string_view text, bool keep_newlines);

// `text` with every byte that is not part of valid UTF-8 replaced by U+FFFD;
// everything else, control characters included, as it is.
std::string valid_utf8(std::string_view text);

}  // namespace sdxl
