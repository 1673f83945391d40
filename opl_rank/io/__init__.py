"""Input and output: logged data as tables (:mod:`~opl_rank.io.tabular`), saved policies
(:mod:`~opl_rank.io.persistence`), atomic writes (:mod:`~opl_rank.io.atomic`) and interop
with obp (:mod:`~opl_rank.io.obp`) and the Open Bandit Dataset (:mod:`~opl_rank.io.obd`).

Nothing is imported here: :mod:`opl_rank.data` uses :mod:`~opl_rank.io.atomic` below the
policies that :mod:`~opl_rank.io.persistence` saves, and the table, obp and OBD modules
load pandas or obp only when used.
"""
