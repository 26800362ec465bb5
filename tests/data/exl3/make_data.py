#!/usr/bin/env python3
"""tests/data/exl3/make_data.py — rebuild this folder's test data from exllamav3's golden
tensors (../shared/golden/exl3/, made by exllamav3 v1.4.1 on an H200; see its README).

    python3 tests/data/exl3/make_data.py /work/shared/golden/exl3 tests/data/exl3

Writes codebooks.safetensors (a verbatim copy) and cases.safetensors. Budget is 10 MB, so
`inner_fp16` (exllamav3's bit-exact decode of the trellis alone) is kept in full for the three
512x256 K=3 cases only; for every case its FNV-1a-64 digest is stored in the metadata as
`<case>.inner_fp16.fnv1a64` (hex), which the test compares bit for bit. `weight_fp16`
(exllamav3's full reconstruction through torch fp16 Hadamards) is kept for one K=3 case per
shape and codebook: the Hadamard/scale path it checks does not depend on K, and every case's
trellis decode is already checked bit for bit through the digest. `weight`/`hessian_sum` are kept
for 512x256 and 256x768 only (for the quantizer's proxy-error tests). The whole repo's test
data must stay under 60 MB."""
import json, shutil, struct, sys

src, dst = sys.argv[1], sys.argv[2]

def load(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop('__metadata__', {})
    return {k: (v['dtype'], v['shape'], b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]])
            for k, v in h.items()}, meta

def fnv1a64(data):
    h = 0xcbf29ce484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return '%016x' % h

t0, meta = load(src + '/golden_0.safetensors')
t1, _ = load(src + '/golden_1.safetensors')
t0.update(t1)
gmeta = json.load(open(src + '/golden_meta.json'))

keep_inner = {'512x256.K3.mul1', '512x256.K3.mcg', '512x256.K3.3inst'}
keep_weight = {'512x256', '256x768'}
keep_weight_fp16 = {'512x256.K3.mul1', '512x256.K3.mcg', '512x256.K3.3inst', '256x768.K3.mul1',
                    '768x256.K3.mul1'}
out, md = {}, {}
cases = sorted({k.rsplit('.', 1)[0] for k in t0 if k.endswith('.trellis')})
md['cases'] = ','.join(cases)
for c in cases:
    for s in ('trellis', 'suh', 'svh'):
        out[c + '.' + s] = t0[c + '.' + s]
    if c in keep_weight_fp16:
        out[c + '.weight_fp16'] = t0[c + '.weight_fp16']
    inner = t0[c + '.inner_fp16']
    md[c + '.inner_fp16.fnv1a64'] = fnv1a64(inner[2])
    if c in keep_inner:
        out[c + '.inner_fp16'] = inner
for m in keep_weight:
    out[m + '.weight'] = t0[m + '.weight']
    out[m + '.hessian_sum'] = t0[m + '.hessian_sum']
for k, v in gmeta.items():
    md[k] = str(v)

hdr, off = {'__metadata__': md}, 0
names = sorted(out)
for k in names:
    dt, shape, data = out[k]
    hdr[k] = {'dtype': dt, 'shape': shape, 'data_offsets': [off, off + len(data)]}
    off += len(data)
hj = json.dumps(hdr, separators=(',', ':')).encode()
hj += b' ' * ((8 - (len(hj) + 8) % 8) % 8)
with open(dst + '/cases.safetensors', 'wb') as f:
    f.write(struct.pack('<Q', len(hj)))
    f.write(hj)
    for k in names:
        f.write(out[k][2])
shutil.copyfile(src + '/codebooks.safetensors', dst + '/codebooks.safetensors')
