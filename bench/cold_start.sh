#!/bin/bash
# A GGUF's first request after its file left the page cache (as after `wsl --shutdown`): drops the file from the
# cache, starts `wslm serve` on it, waits WAIT seconds after /health answers, streams one chat and prints the time
# to its first token and the decode speed after it.
#
#   bench/cold_start.sh FILE.gguf [WAIT_SECONDS] [PORT]      # WSLM_GGUF_PREFETCH=0 in the environment: no read-ahead
#
# Run from the repository root with its .venv. docs/benchmarks.md has the figures (one run each: not averaged).
set -euo pipefail
FILE=${1:?usage: bench/cold_start.sh FILE.gguf [WAIT_SECONDS] [PORT]}
WAIT=${2:-20}
PORT=${3:-8765}
PY=.venv/bin/python
"$PY" -c "import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)" "$FILE"
start=$(date +%s.%N)
.venv/bin/wslm serve "$FILE" --port "$PORT" --max-model-len 2048 > /tmp/wslm-cold-start.log 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 240); do
    sleep 0.5
    curl -sf "localhost:$PORT/health" > /dev/null && break
done
ready=$(date +%s.%N)
echo "ready after $(echo "$ready - $start" | bc) s (WSLM_GGUF_PREFETCH=${WSLM_GGUF_PREFETCH:-1})"
sleep "$WAIT"
PORT=$PORT "$PY" - <<'PY'
import os
import time

import openai

client = openai.OpenAI(base_url=f"http://localhost:{os.environ['PORT']}/v1", api_key="x")
model = client.models.list().data[0].id
sent, first, n = time.time(), None, 0
stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello"}],
                                        max_tokens=32, stream=True, temperature=0)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        n += 1
        first = first or time.time()
print(f"time to first token {first - sent:.2f} s; then {(n - 1) / (time.time() - first):.1f} tok/s")
PY
