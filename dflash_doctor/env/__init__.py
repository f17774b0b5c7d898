"""The environment model: what is installed and what the machine is, read from files and NVML only.

Owns: installed distributions (dist-info, RECORD, WHEEL), the audited interpreter and its import path,
torch's build (`torch/version.py`), ELF dynamic sections (`elf`), the requirement graph through extras, the CUDA family of each
package, RECORD audits and file hashes, the parse cache, cached-bytecode state, pip commands aimed at
the audited interpreter, and the driver and GPUs (`gpus`), and which of them CUDA_VISIBLE_DEVICES leaves to CUDA
(`visible_devices`).

Never imports torch. May import: the core (`dflash_base.errors`, `paths`, `atomic`, `findings`).
Nothing here imports `libs`, `cache`, `lock`, `launch`, `audit`, `commands` or `checks`.
"""
