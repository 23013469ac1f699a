#!/bin/sh
# Regenerate every golden file in golden/ (docs/golden.md). Run from anywhere; paths are repo-relative.
# Do this only after a change that is *meant* to change refimpl's numbers, and say why in the commit.
# `refimpl golden check golden/FILE.jsonl` (or `pytest tests/test_golden.py`) verifies them.
set -eu
cd "$(dirname "$0")/.."
REFIMPL=${REFIMPL:-refimpl}
JOBS=${JOBS:-2}
P=golden/prompts.jsonl
N=24
for q in f32 bf16 q8_0 q4_k_m mxfp4; do
    $REFIMPL golden make builtin:tiny/$q --prompts $P -n $N --out golden/tiny-$q.jsonl --jobs $JOBS
done
$REFIMPL golden make builtin:tiny/q4_k_m --prompts $P -n $N --emulate=plain --kv-type f16 --out golden/tiny-q4_k_m-emulate.jsonl --jobs $JOBS
$REFIMPL golden make builtin:predictable/q8_0 --prompts $P -n $N --out golden/predictable-q8_0.jsonl --jobs $JOBS
$REFIMPL golden make builtin:predictable/q8_0 --prompts $P -n $N --mtp --draft 3 --out golden/predictable-q8_0-mtp3.jsonl --jobs $JOBS
$REFIMPL golden make builtin:kjv --prompts golden/prompts-kjv.txt -n $N --out golden/kjv-q8_0.jsonl --jobs $JOBS
$REFIMPL golden make builtin:kjv --prompts golden/prompts-kjv.txt -n $N --mtp --draft 3 --out golden/kjv-q8_0-mtp3.jsonl --jobs $JOBS
