"""What a run is, in plain data: read by the gate before any process starts, so nothing here imports torch.

Owns: the run config (`config`: TOML -> validated dataclasses, each field declared once with its rule and its
effect from `fields`; `field_effects`: what changing a field changes, for the doctor's warm-up key and time
plan; `config_file`: finding, reading, overriding and writing config files), what an eval and a regeneration
are asked to do (`eval_request`, `regenerate_request`), the topology's roles and the one reading of
`[topology]` (`topology`), the target's shapes read from its config.json (`target_shapes`), the data-file
checks (`data_files`), the mask token rule (`mask_token`), optional extras (`extras`), and the names of the
files a run writes (`outputs`).
May import: `dflash_base`, the standard library, and each other. **No torch, no transformers at import**
(`tests/test_layers.py` imports every module here in a fresh interpreter and looks at `sys.modules`).
"""
