#!/usr/bin/env python3
"""SIGTERM with long streams, on the real binary:
1. --shutdown-timeout 1: streams still running at the deadline end with a final error event naming
   the shutdown and `data: [DONE]`; the process exits 0 within a few seconds.
2. --shutdown-timeout 120 and a second SIGTERM: the second signal cuts the streams at once.

usage: shutdown_test.py DELTASERVE_BINARY TOKENIZER_DIR
"""
import json
import re
import signal
import socket
import subprocess
import sys
import time

STREAM = json.dumps({"prompt": "Tell me a story", "max_tokens": 7000, "ignore_eos": True,
                     "stream": True})


def start(binary, tokenizer, timeout_s):
    p = subprocess.Popen([binary, "serve", "--port", "0", "--tokenizer", tokenizer,
                          "--shutdown-timeout", str(timeout_s)],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if m:
            return p, int(m.group(1))
    raise AssertionError("no address printed")


def post(port, body):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode())
    return s


def first_event(s):
    got = b""
    s.settimeout(60)
    while b"data: " not in got:
        chunk = s.recv(65536)
        assert chunk, "stream closed before its first event"
        got += chunk
    return got


def rest(s, limit_s):
    got = b""
    s.settimeout(limit_s)
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    except socket.timeout:
        raise AssertionError(f"stream still open after {limit_s} s")
    return got.decode(errors="replace")


def scenario(binary, tokenizer, timeout_s, second_signal):
    p, port = start(binary, tokenizer, timeout_s)
    streams = [post(port, STREAM) for _ in range(3)]
    for s in streams:
        first_event(s)
    t0 = time.time()
    p.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    if second_signal:
        p.send_signal(signal.SIGTERM)
    for s in streams:
        tail = rest(s, 30)
        assert "shutting down" in tail, tail[-400:]
        assert tail.rstrip().endswith("data: [DONE]"), tail[-200:]
    code = p.wait(timeout=30)
    took = time.time() - t0
    assert code == 0, code
    bound = timeout_s + 10 if not second_signal else 10
    assert took < bound, took
    print(f"[figure] shutdown-timeout {timeout_s} s, second signal {second_signal}: 3 open streams "
          f"ended with an error event and [DONE]; exit 0 after {took:.2f} s")


def main():
    binary, tokenizer = sys.argv[1], sys.argv[2]
    scenario(binary, tokenizer, 1, False)
    scenario(binary, tokenizer, 120, True)


if __name__ == "__main__":
    main()
