#!/usr/bin/env python3
# kernels/cuda/lab/sass_loop_stat.py — instructions per 16x16 tile in the
# innermost decode loop of a CUDA kernel, from its SASS (how the lab counts
# the cost of each version before spending GPU time).
#
#   sass_loop_stat.py FILE.o|cubin|executable 'REGEX'
#
# For each function whose mangled name matches REGEX: finds the smallest
# backward-branch loop that contains HMMA instructions, counts its
# instructions, takes tiles = HMMA / 2 (two m16n8k16 per tile) and prints
# instructions per tile and the opcode histogram per tile; a loop without
# HMMA (the integer GEMM, v20+) counts IMMA instead (two m16n8k32 per tile
# and row group: use it on the RG = 1 instances). Needs cuobjdump
# on PATH (the CUDA toolkit; or the nvidia-cuda-cuobjdump wheel).
import collections
import re
import subprocess
import sys

cub, fre = sys.argv[1], sys.argv[2]
out = subprocess.run(['cuobjdump','-sass',cub],capture_output=True,text=True).stdout
funcs = re.split(r'\n\s*Function : ', out)
for f in funcs[1:]:
    name = f.split('\n',1)[0].strip()
    if not re.search(fre, name): continue
    ins = []
    for m in re.finditer(r'/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);', f):
        ins.append((int(m.group(1),16), m.group(3), m.group(4)))
    addr = {a:i for i,(a,_,_) in enumerate(ins)}
    best=None
    for i,(a,op,args) in enumerate(ins):
        if op.startswith('BRA'):
            mm = re.search(r'0x([0-9a-f]+)', args)
            if mm:
                t=int(mm.group(1),16)
                if t < a and t in addr:
                    body = ins[addr[t]:i+1]
                    h = sum(1 for x in body if x[1].startswith(('HMMA', 'IMMA')))
                    if h and (best is None or len(body)<len(best[2])): best=(t,a,body)
    if not best: print(name,'no loop'); continue
    body=best[2]; h=sum(1 for x in body if x[1].startswith('HMMA'))
    if not h: h=sum(1 for x in body if x[1].startswith('IMMA'))
    c=collections.Counter(x[1].split('.')[0] for x in body)
    tiles=h/2
    print(f"{name[:70]}: loop {len(body)} instrs, {tiles:.0f} tiles, {len(body)/tiles:.1f}/tile")
    print('   ', ' '.join(f"{k}:{v/tiles:.1f}" for k,v in c.most_common()))
    # v24+ (k_gemm_int2): a forward branch after the last mma skips the int32 ->
    # fp32 conversion, which runs once per 8 loop trips (one 128-input block)
    last = max(j for j,x in enumerate(body) if x[1].startswith(('HMMA','IMMA')))
    fwd = [j for j,x in enumerate(body) if x[1].startswith('BRA') and j > last and re.search(r'0x([0-9a-f]+)', x[2])]
    if fwd and name.find('k_gemm_int2') >= 0:
        j = fwd[0]; t = int(re.search(r'0x([0-9a-f]+)', body[j][2]).group(1), 16)
        k = [q for q,x in enumerate(body) if x[0] == t]
        if k and k[0] > j:
            conv = k[0] - (j + 1); per = len(body) - conv
            print(f"    per trip {per} ({per/tiles:.1f}/tile) + conversion {conv} every 8 trips: "
                  f"{(per + conv/8)/tiles:.1f}/tile executed")
