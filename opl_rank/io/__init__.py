"""Input and output: logged data as tables ([`tabular`][opl_rank.io.tabular]), saved policies
([`persistence`][opl_rank.io.persistence]), atomic writes ([`atomic`][opl_rank.io.atomic]) and interop
with obp ([`obp`][opl_rank.io.obp]) and the Open Bandit Dataset ([`obd`][opl_rank.io.obd]).

Nothing is imported here: [`opl_rank.data`][opl_rank.data] uses [`atomic`][opl_rank.io.atomic] below the
policies that [`persistence`][opl_rank.io.persistence] saves, and the table, obp and OBD modules
load pandas or obp only when used.
"""
