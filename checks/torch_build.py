"""Which torch build is installed: variant, git commit, WHEEL build tag, installer.

"The same version" is not the same build: PyPI has torch 2.10.0 wheels that differ only in their
WHEEL `Build` tag, and nightlies share version strings across commits. So we always name the commit.
"""

from __future__ import annotations

from collections.abc import Iterator

from dflash_doctor.context import CheckContext
from dflash_doctor.env.pip_commands import install_command, reinstall_command
from dflash_doctor.findings import Finding, fail, ok, warn
from dflash_doctor.registry import check


@check("torch.build", "torch build")
def torch_build(ctx: CheckContext) -> Iterator[Finding]:
    env = ctx.env
    build, dist = env.torch, env.torch_dist
    if build is None:
        yield fail(
            "torch.missing",
            f"torch is not installed for {env.interpreter.executable}",
            remedy=install_command(env, "torch"),
            searched=env.interpreter.site_dirs,
        )
        return
    commit = (build.git_version or "unknown")[:12]
    facts = {
        "version": build.version,
        "variant": build.variant,
        "cuda": build.cuda or "none",
        "git_version": build.git_version or "unknown",
        "package_dir": build.package_dir,
    }
    if dist is not None:
        facts.update(
            wheel_tag=", ".join(dist.wheel_tags) or "unknown",
            wheel_build=dist.wheel_build or "none",
            installer=dist.installer or "unknown",
            dist_info=dist.dist_info,
        )
    yield ok("torch.build", f"torch {build.version} · {build.variant} · git {commit}", **facts)

    if dist is None:
        yield warn(
            "torch.no_metadata",
            "torch has no dist-info: its files and requirements cannot be verified",
            remedy=reinstall_command(env, f"torch=={build.public_version}"),
            package_dir=build.package_dir,
        )
    elif not _same_release(dist.version, build.version):
        yield fail(
            "torch.version_mismatch",
            f"torch/version.py says {build.version} but its dist-info says {dist.version}: a half-replaced install",
            remedy=reinstall_command(env, f"torch=={dist.version}"),
            version_py=build.version,
            dist_info=dist.dist_info,
        )
    if build.local_tag and build.cuda and not build.local_tag.startswith("cu"):
        yield warn(
            "torch.local_tag",
            f"local tag +{build.local_tag} does not name the CUDA {build.cuda} it was built with",
            local_tag=build.local_tag,
            cuda=build.cuda,
        )
    for other in env.shadowed:
        if other.key == "torch":
            yield warn(
                "torch.shadowed",
                f"a second torch {other.version} in {other.site_dir} is hidden by the one imported",
                imported=build.package_dir,
                hidden=other.dist_info,
                # No command: this interpreter's `pip uninstall torch` would take the torch it imports.
                fix=f"remove the hidden torch with the pip of the environment that owns {other.site_dir}",
            )


def _same_release(dist_version: str, module_version: str) -> bool:
    """dist-info may carry the local tag (`2.13.0+cpu` from the PyTorch index) or not (`2.11.0` from PyPI)."""
    from packaging.version import InvalidVersion, Version

    try:
        dist, module = Version(dist_version), Version(module_version)
    except InvalidVersion:
        return dist_version == module_version
    return dist == module if dist.local else dist.public == module.public
