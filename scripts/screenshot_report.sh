#!/usr/bin/env bash
# Renders a report.html (or any local page) to a PNG with headless Chromium, to
# look at a run's report without a desktop, or to check the page's layout.
# Usage: scripts/screenshot_report.sh REPORT.html OUT.png [WIDTHxHEIGHT]
# Installs Debian's chromium if it is missing. The page is self-contained, so
# the browser needs no network.
set -euo pipefail

if [ $# -lt 2 ]; then
  echo "usage: $0 REPORT.html OUT.png [WIDTHxHEIGHT (default 1400x1800)]" >&2
  exit 2
fi
page=$1
out=$2
size=${3:-1400x1800}
[ -f "$page" ] || { echo "screenshot_report: no such file: $page" >&2; exit 2; }
[[ $size =~ ^[0-9]+x[0-9]+$ ]] || { echo "screenshot_report: size must be WIDTHxHEIGHT, got: $size" >&2; exit 2; }

browser=""
for b in chromium chromium-browser; do
  command -v "$b" >/dev/null && { browser=$b; break; }
done
if [ -z "$browser" ]; then
  echo "screenshot_report: installing chromium (Debian package)" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
  browser=chromium
fi

page_abs=$(realpath "$page")
out_abs=$(realpath -m "$out")
mkdir -p "$(dirname "$out_abs")"
# A private profile dir: no clash with a running browser, nothing left behind.
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$profile" \
  --screenshot="$out_abs" --window-size="${size/x/,}" "file://$page_abs" 2>/dev/null
[ -s "$out_abs" ] || { echo "screenshot_report: chromium wrote no screenshot to $out_abs" >&2; exit 1; }
echo "$out_abs"
