#!/usr/bin/env python3
"""tests/quantize/make_quant_cases.py — write tests/data/exl3/quant-cases.safetensors: the
weight and Hessian of exllamav3's 768x256 golden case, which tests/data/exl3/cases.safetensors
leaves out (it keeps them for 512x256 and 256x768 only). Source: ../shared/golden/exl3/ (made by
exllamav3 v1.4.1; see its README). The quantizer's golden test (test_ldlq) reads both files.
The Hessian is symmetric, so only its upper triangle (row-major, diagonal included) is stored,
as `768x256.hessian_sum_upper` F32 [k(k+1)/2]; the test expands it (saves 1.2 MB).

    python3 tests/quantize/make_quant_cases.py /work/shared/golden/exl3 tests/data/exl3
"""
import json, struct, sys

import numpy as np

src, dst = sys.argv[1], sys.argv[2]
tensors = {}
for f in ('golden_0.safetensors', 'golden_1.safetensors'):
    b = open(src + '/' + f, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    h.pop('__metadata__', None)
    for k, v in h.items():
        if k in ('768x256.weight', '768x256.hessian_sum'):
            tensors[k] = (v['dtype'], v['shape'], b[8 + n + v['data_offsets'][0]:8 + n + v['data_offsets'][1]])
dt, shape, data = tensors.pop('768x256.hessian_sum')
h = np.frombuffer(data, dtype='<f4').reshape(shape)
assert np.array_equal(h, h.T), 'Hessian is not exactly symmetric'
upper = h[np.triu_indices(shape[0])].astype('<f4')
tensors['768x256.hessian_sum_upper'] = ('F32', [int(upper.size)], upper.tobytes())
meta = json.load(open(src + '/golden_meta.json'))
hdr, off = {'__metadata__': {'768x256.count': str(meta['768x256.count'])}}, 0
for k in sorted(tensors):
    dt, shape, data = tensors[k]
    hdr[k] = {'dtype': dt, 'shape': shape, 'data_offsets': [off, off + len(data)]}
    off += len(data)
hj = json.dumps(hdr, separators=(',', ':')).encode()
hj += b' ' * ((8 - (len(hj) + 8) % 8) % 8)
with open(dst + '/quant-cases.safetensors', 'wb') as f:
    f.write(struct.pack('<Q', len(hj)))
    f.write(hj)
    for k in sorted(tensors):
        f.write(tensors[k][2])
