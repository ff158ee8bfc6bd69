import glob, collections, statistics
ev = collections.defaultdict(dict)
for f in glob.glob('/tmp/abs_trace.*.txt'):
    for line in open(f):
        p = line.split()
        if len(p) != 3: continue
        rid, lab, t = p
        if lab == 'c_sent': continue
        if lab == 'c_sent_at': lab = 'c_sent'
        ev[rid].setdefault(lab, float(t))
order = ['c_sent', 'g_asgi', 'g_body', 'g_route', 'g_jobs', 'gen', 'sub', 'take', 'match', 'alloc', 'prep', 'sent', 'sentC', 'reply', 'tok', 'yield', 'g_msg', 'g_yield', 'c_chunk', 'c_text']
seg = collections.defaultdict(list); full = 0
for rid, d in ev.items():
    if 'c_text' not in d or 'c_sent' not in d: continue
    full += 1
    labs = [l for l in order if l in d]
    for a, b in zip(labs, labs[1:]):
        seg[f'{a}->{b}'].append((d[b] - d[a]) * 1e3)
    seg['TOTAL'].append((d['c_text'] - d['c_sent']) * 1e3)
print('requests', full)
for k, v in seg.items(): print(f'{k:18s} n={len(v):4d} p50 {statistics.median(v):7.3f} mean {statistics.fmean(v):7.3f}')
