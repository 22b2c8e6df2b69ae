#!/bin/sh
# Runs tests/models/seesaw.py, the fp64 model of body_ss's online-softmax
# bookkeeping, against a plain softmax reference. 77 (skip) without python3
# and numpy (Debian: python3-numpy).
here=$(cd "$(dirname "$0")" && pwd)
for py in python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -c "import numpy" 2>/dev/null; then
    exec "$py" "$here/seesaw.py"
  fi
done
echo "SKIP: no python3 with numpy"
exit 77
