#!/usr/bin/env python3
"""Rewrites a GGUF checkpoint with every 2-D weight in BF16 (quantised types dequantised with PyPI
`gguf`'s reference dequantiser; 1-D tensors such as norms stay F32), metadata copied unchanged.
The speed comparison with llama.cpp (scripts/bench-llamacpp.sh) runs both engines on the file this
writes, so both compute with the same bf16 weights.

  /usr/bin/python3 tools/gguf/to_bf16.py IN.gguf OUT.gguf
"""
import sys

import numpy as np
import gguf


def main(src: str, dst: str) -> None:
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # written by GGUFWriter itself
        if name == "general.file_type":
            continue  # the weights' type changes: written below
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        writer.add_key_value(name, field.contents(), vtype, sub_type=sub)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)  # float32, numpy shape = reversed(ggml ne)
        if values.ndim >= 2:
            bf16 = gguf.quants.quantize(values.astype(np.float32), gguf.GGMLQuantizationType.BF16)
            writer.add_tensor(t.name, bf16, raw_shape=bf16.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(t.name, values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
