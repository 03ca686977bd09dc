"""Live heap per call stack at two instants of a heaptrack profile.

Usage: heap_diff.py PROFILE.gz T0_SECONDS T1_SECONDS [ROWS]

Reads heaptrack's interpreted format (what heaptrack_interpret writes),
replays every allocation and free, and prints the live bytes at T0 and T1
by owner (the first matching frame of the call stack) and by call site.
"""
import sys,gzip,re,collections
path=sys.argv[1]; T=[float(x)*1000 for x in sys.argv[2:4]]
strings=['']; ips=[None]; traces=[(0,0)]; allocs=[]
live=[]; snaps=[]; now=0; ti=0
with gzip.open(path,'rt',errors='replace') as f:
    for line in f:
        c=line[0]
        if c=='+':
            live[int(line[2:],16)]+=1
        elif c=='-':
            live[int(line[2:],16)]-=1
        elif c=='a':
            _,s,t=line.split(); allocs.append((int(s,16),int(t,16))); live.append(0)
        elif c=='c':
            now=int(line[2:],16)
            while ti<len(T) and now>=T[ti]:
                snaps.append((now,list(live))); ti+=1
        elif c=='t':
            _,ip,p=line.split(); traces.append((int(ip,16),int(p,16)))
        elif c=='i':
            parts=line.split(); fr=[]
            # i ip module [func file line]...
            rest=parts[3:]
            for k in range(0,len(rest),3):
                fr.append(int(rest[k],16))
            ips.append(fr)
        elif c=='s':
            strings.append(line[2:].rstrip('\n').split(' ',1)[1] if ' ' in line[2:] else '')
def frames(tr):
    out=[]
    while tr:
        ip,p=traces[tr]
        for fi in ips[ip] or []:
            out.append(strings[fi] if fi<len(strings) else '?')
        tr=p
    return out
PAT=[('transcript (runtime history/turn)',r'berth_runtime..history|Transcript|berth_runtime..engine'),
     ('redb (page cache / write buffer)',r'redb::'),
     ('websocket buffers (tungstenite)',r'tungstenite'),
     ('watchers / outbound frames',r'berth_actors..watch|render_notice|ConnectionWatcher|Outbound|encode_notification'),
     ('scheduler',r'berth_scheduler'),('ractor mailboxes',r'ractor::'),('metrics',r'metrics'),
     ('storage (berth_storage)',r'berth_storage'),('actors (other)',r'berth_actors'),
     ('acp adapter (other)',r'berth_acp'),('tokio',r'tokio::')]
cache={}
def cls(tr):
    if tr in cache: return cache[tr]
    fs=frames(tr); cat='other'
    for n,p in PAT:
        if any(re.search(p,x) for x in fs): cat=n;break
    key=next((re.sub(r'::h[0-9a-f]{16}$','',x)[:110] for x in fs if re.search(r'berth_|redb::|tungstenite|ractor::',x)),fs[0][:90] if fs else '?')
    cache[tr]=(cat,key); return cache[tr]
print('snapshots at', [s[0]/1000 for s in snaps])
res=[]
for t,l in snaps:
    c=collections.Counter(); d=collections.Counter(); cnt=collections.Counter()
    for i,n in enumerate(l):
        if n:
            sz,tr=allocs[i]; cat,key=cls(tr); c[cat]+=n*sz; d[(cat,key)]+=n*sz; cnt[(cat,key)]+=n
    res.append((c,d,cnt))
(a,da,na),(b,db,nb)=res[0],res[1]
print('total live heap: %.2f MB -> %.2f MB'%(sum(a.values())/1e6,sum(b.values())/1e6))
for k in sorted(set(a)|set(b),key=lambda k:-(b[k]-a[k])):
    print('%8.2f MB -> %8.2f MB  (%+8.2f MB)  %s'%(a[k]/1e6,b[k]/1e6,(b[k]-a[k])/1e6,k))
print()
for k in sorted(set(da)|set(db),key=lambda k:-(db[k]-da[k]))[:int(sys.argv[4]) if len(sys.argv)>4 else 25]:
    print('%8.3f MB -> %8.3f MB (%+8.3f MB, %+7d blocks) [%s] %s'%(da[k]/1e6,db[k]/1e6,(db[k]-da[k])/1e6,nb[k]-na[k],k[0],k[1]))
