import os, socket, time, select, sys
N=20000
a,b=socket.socketpair(socket.AF_INET if False else socket.AF_UNIX)
# use TCP loopback
srv=socket.socket(); srv.bind(("127.0.0.1",0)); srv.listen(1)
c=socket.create_connection(srv.getsockname()); s,_=srv.accept()
for x in (c,s): x.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
pid=os.fork()
if pid==0:
    ep=select.epoll(); ep.register(s.fileno(), select.EPOLLIN)
    got=0
    while got< N*100:
        ep.poll()
        got+=len(s.recv(1<<20))
    os._exit(0)
msg=b"x"*100
mode=sys.argv[1]
t0=time.process_time(); w0=time.perf_counter()
for i in range(N):
    c.send(msg)
    if mode=="gap": 
        end=time.perf_counter()+0.0002
        while time.perf_counter()<end: pass
t1=time.process_time(); w1=time.perf_counter()
os.waitpid(pid,0)
r=os.times()
print(mode, "sender cpu per send (incl. spin)", (t1-t0)/N*1e6, "us; wall", (w1-w0)/N*1e6, "child cpu per msg", (r.children_user+r.children_system)/N*1e6)
