"""What only the notebooks (and the tests) use: running lessons, reading their logs, tables and
plots.

The lesson scripts never import this package; they import `trainup` (data, models, cli, metrics,
checkpoint, devices, distributed...).

The notebooks' toolkit, here at the top, is what any lesson may use; one lesson's own helpers are in
lessons/bylesson/ (`from lessons.bylesson import ddp`), and the toolkit imports none of them
(tests/test_structure.py):

- report:  run a lesson script, read run logs back into tables, draw and save plots
- launch:  start torchrun jobs from a notebook (one node, or two nodes simulated on this machine)
- checks:  what must hold after a run (finished, schema, learned, same parameters, figures):
  notebooks assert them
- claims:  sentences about measured results, their direction computed (rises/flattens, N× faster, a
  loaded machine)
- machine: lesson 00, what this machine has (CPUs, GPUs, backends) and leftover training processes
- manifest: the course's scripts, one entry each, and what every registry reads of them
- reference: the reference runs a later lesson reads when this machine has made none
- perfmodel, hardware: a step's time as arithmetic (the cost formulas), published links and machines
- jobs, log_reader, placement: plumbing (one job runner, one log reader, the one device decision)
"""
