"""Everything that runs before and around torchrun: `dflash-doctor train` below the command line.

Owns: the gate (`gate`: validate the config, plan, run the checks), the launch plan (`plan`: ranks to
roles to devices, the torchrun command and environment; for one process in all the trainer's own command:
`direct`), the topology choice (`topology`: split,
colocated, or auto's pick), memory estimates (`memory_plan`), the best N+M split and the colocated
projection from measured role rates (`split`), the launch's compile cache (`compile_cache`: warm before,
snapshot after a success), what a run left in its output folder (`run_outputs`), torchrun and its process
tree (`supervise`: stop signals forwarded, nothing left behind), one run per output folder (`output_lock`)
and run records (`runs`).

May import: `lock`, `audit`, `libs`, `cache`, `deep`, `env`, the core, and the trainer's config
readers (`trainer.runspec.config`, `trainer.runspec.target_shapes`, `trainer.runspec.topology`: no torch). Never the trainer's
model code.
"""
