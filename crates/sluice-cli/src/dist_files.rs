//! `sluice dist-files --out DIR` (hidden): the man pages and shell completions that packages
//! ship, generated from the CLI definition itself so they never drift from `--help`.
//! `scripts/package.sh` runs it (and gzips the pages) before `cargo deb`; the Debian package
//! installs `DIR/man/*.1.gz` and `DIR/completions/{sluice.bash,_sluice,sluice.fish}`. Being a
//! subcommand of the binary rather than a build script or an xtask, it needs no second build:
//! whatever binary is packaged writes its own pages.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap_complete::Shell;

/// Writes `out/man/` (one page per command: `sluice.1`, `sluice-serve.1`, ...) and
/// `out/completions/` (bash, zsh, fish); returns the files written.
pub(crate) fn write(cmd: clap::Command, out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let man = out.join("man");
    let completions = out.join("completions");
    for dir in [&man, &completions] {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // Hidden subcommands (this one) are left out: clap_complete would offer them.
    let visible = cmd.get_subcommands().filter(|c| !c.is_hide_set()).cloned();
    let mut cmd = clap::Command::new("sluice")
        .version(sluice_server::build_info::LONG_VERSION)
        .about(cmd.get_about().cloned().unwrap_or_default())
        .subcommands(visible);
    let mut written = Vec::new();
    // No pages for `help` (clap's own subcommand); `build` gives the subcommands their full
    // names (`sluice-serve`).
    let mut pages = cmd.clone().disable_help_subcommand(true);
    pages.build();
    for page in std::iter::once(&pages).chain(pages.get_subcommands()) {
        let path = man.join(format!("{}.1", page.get_display_name().unwrap_or("sluice")));
        let mut text = Vec::new();
        clap_mangen::Man::new(page.clone())
            .date(sluice_server::build_info::BUILD_DATE)
            .source(format!("sluice {}", sluice_server::build_info::VERSION))
            .manual("Sluice")
            .render(&mut text)
            .and_then(|()| std::fs::write(&path, text))
            .with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
    }
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut cmd, "sluice", &completions)
            .with_context(|| format!("cannot write the {shell} completions"))?;
        written.push(path);
    }
    Ok(written)
}
