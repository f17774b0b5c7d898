"""Through `dflash-doctor train`, end to end: time to first step, steady throughput, data wait and memory
(`e2e`), topologies side by side, stopping a run with a signal, and where start-up imports go."""
