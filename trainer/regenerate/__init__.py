"""`data regenerate`: the target writes the answers the drafter will learn from.

Owns: the job (`job`: input checks, resume, the output file, the commit pace), its prompt and conversation
records (`conversations`), what an engine is asked and gives back (`settings`), and the engines that answer:
the KV engine over `trainer.engine` (`kv_engine`), transformers' `generate` for other targets
(`generate_engine`), vLLM (`vllm_engine`), and the choice among them on the devices given (`engines`).
May import: `trainer.runspec`, `trainer.model`, `trainer.target_model`, `trainer.data`, `trainer.engine`,
`dflash_base`. Never `trainer.run` or `trainer.eval`.
"""
