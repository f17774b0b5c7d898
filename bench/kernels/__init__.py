"""One role on one device: the drafter step and its variants, flex_attention kernel options, layer against
stack compilation, target capture, the colocated baseline, and the per-role rates `auto` decides on."""
