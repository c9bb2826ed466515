#!/usr/bin/env bash
# session 8 call 4: where the binding's host time goes (tvm-ffi tensor conversion on torch 2.11 vs a launch)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1
PYTHONPATH=/tmp/site timeout 90 python3 .whl/probe.py 2>&1 | tee $OUT/probe.txt
