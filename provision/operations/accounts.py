"""The training account that several deploys make: the same user, uid and gid on every node.

NFS maps owners by number, so base and nfs both call training_account (`up --only nfs` on a
fresh host must give the same ids); preflight refuses an account with other ids."""

from __future__ import annotations

from pyinfra import host
from pyinfra.operations import server

from provision.facts.probes import Account, AccountFact
from provision.settings import Settings


def training_account(settings: Settings) -> None:
    """The training user and its group, with the pinned uid/gid. The one place that makes
    the account: the nfs step calls it too, so `up --only nfs` on a fresh host gives the
    same ids (NFS maps owners by number; preflight refuses an account with other ids)."""
    user, uid = settings.training_user, settings.training_uid
    wanted = Account(uid, uid, f"/home/{user}", "/bin/bash", user, uid)
    if host.get_fact(AccountFact, user=user) == wanted:
        return  # already so: pyinfra's user/group ops would only re-read every account
    server.group(name=f"training group {user}", group=user, gid=uid)
    server.user(
        name=f"training user {user}",
        user=user,
        uid=uid,
        group=user,
        home=f"/home/{user}",
        shell="/bin/bash",
        create_home=True,
    )
