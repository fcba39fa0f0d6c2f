#!/usr/bin/env python3
"""1,100 idle connections to a server started with `ulimit -n 1024` on 127.0.0.1:8123, then closed:
how many got 503, and how soon /health answers again (defect 3 of the reliability issue)."""
import socket, time, urllib.request, resource
resource.setrlimit(resource.RLIMIT_NOFILE,(4096,4096))
socks=[]
for i in range(1100):
    s=socket.create_connection(('127.0.0.1',8123)); socks.append(s)
time.sleep(1)
# the extra connections were answered 503 and closed by the server
rej=0
for s in socks[-140:]:
    s.setblocking(False)
    try:
        d=s.recv(100)
        if d.startswith(b'HTTP/1.1 503'): rej+=1
    except BlockingIOError: pass
print('connections beyond the cap answered 503:', rej)
try:
    urllib.request.urlopen('http://127.0.0.1:8123/health', timeout=3); print('health while 1100 held: 200')
except Exception as e: print('health while 1100 held:', e)
for s in socks: s.close()
t=time.time()
while True:
    try:
        urllib.request.urlopen('http://127.0.0.1:8123/health', timeout=2); break
    except Exception: time.sleep(0.05)
print('health after closing: 200 after %.2f s'%(time.time()-t))
