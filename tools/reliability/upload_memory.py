#!/usr/bin/env python3
"""Four concurrent 31 MiB bodies to /v1/completions on 127.0.0.1:8123 (defect 8 of the reliability issue).
usage: upload_memory.py array|string   -- then read VmHWM of the server process."""
import socket, threading, json, time, sys
n=31*1024*1024
kind=sys.argv[1]
if kind=='array':
    body=('{"prompt":"hi","max_tokens":1,"x":['+'1,'*((n-40)//2)+'1]}').encode()
else:
    body=('{"prompt":"hi","max_tokens":1,"x":"'+'a'*(n-40)+'"}').encode()
res=[]
def go():
    s=socket.create_connection(('127.0.0.1',8123))
    s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n'%len(body))
    try: s.sendall(body)
    except Exception: pass
    out=b''; s.settimeout(120)
    try:
        while True:
            c=s.recv(65536)
            if not c: break
            out+=c
    except Exception as e: out+=str(e).encode()
    res.append(out[9:12])
ts=[threading.Thread(target=go) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print(kind, len(body), sorted(res))
