"""`provision validate`: the hardware acceptance gate.

The node agent (``agent.py``) measures one machine and prints JSON; the controller
(``controller.py``) runs it everywhere, adds the network rounds (``rounds.py``) and the
multi-node all-reduce; ``judge.py`` turns values and expectations (``expectations.py``)
into a verdict per node; ``report_*.py`` write it out; ``history.py`` keeps the trend.
"""
