#!/usr/bin/env bash
# Screenshots of a report in a real headless browser (Debian's chromium), to look at what a
# reader sees: report.html at a few window sizes (full pages, long enough for the whole report)
# and each SVG plot on its own.
#   scripts/report-screenshots.sh <report-dir> <out-dir>
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: $0 <report-dir> <out-dir>" >&2
    exit 2
fi
report=$(cd "$1" && pwd)
mkdir -p "$2"
out=$(cd "$2" && pwd)
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
    echo "no chromium found (Debian: apt-get install chromium)" >&2
    exit 1
fi
shot() { # <file:// url> <png> <width,height>
    "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --screenshot="$2" \
        --window-size="$3" "$1" >/dev/null 2>&1
    echo "$2"
}
[ -f "$report/report.html" ] || { echo "$report/report.html: no such file" >&2; exit 1; }
# Full pages: the window is as tall as REPORT_HEIGHT (default 16000 px); the PNG shows that much.
for width in 1280 800; do
    shot "file://$report/report.html" "$out/report-$width.png" "$width,${REPORT_HEIGHT:-16000}"
done
for plot in "$report"/*.svg; do
    [ -e "$plot" ] || continue
    name=$(basename "$plot" .svg)
    size=$(sed -n 's/.*<svg[^>]* width="\([0-9]*\)" height="\([0-9]*\)".*/\1,\2/p' "$plot" | head -1)
    shot "file://$plot" "$out/$name.png" "${size:-1000,800}"
done
