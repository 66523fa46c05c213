//! The drill's `--pause`: once the steady state is reached, wait for the user to press Enter before the
//! change, so that they can open the console first and watch the whole change there.

use std::io::BufRead;

/// What the prompt says on standard error.
pub const PROMPT: &str =
    "drill: steady state reached; press Enter to start the change (the console shows it live)";

/// Why the drill went on.
#[derive(Debug)]
pub enum Resumed {
    /// A line was read (the user pressed Enter).
    Line,
    /// The input was closed (EOF), e.g. `< /dev/null`: nobody can press Enter, so the drill goes on.
    Closed,
    /// The input could not be read; the drill goes on.
    Unreadable(std::io::Error),
}

/// Prints [`PROMPT`] and waits, on a blocking thread (the traffic keeps running meanwhile), for one
/// line of the input `open` gives there (e.g. `|| std::io::stdin().lock()`). EOF or a read error does
/// not stop the drill: it goes on and says so.
pub async fn for_enter<F, R>(open: F) -> Resumed
where
    F: FnOnce() -> R + Send + 'static,
    R: BufRead,
{
    eprintln!("{PROMPT}");
    let read = tokio::task::spawn_blocking(move || read_one_line(open())).await;
    let resumed = match read {
        Ok(resumed) => resumed,
        Err(error) => Resumed::Unreadable(std::io::Error::other(format!(
            "the thread reading standard input failed: {error}"
        ))),
    };
    match &resumed {
        Resumed::Line => tracing::info!("drill: Enter pressed; starting the change"),
        Resumed::Closed => eprintln!(
            "drill: standard input is closed (EOF), nobody can press Enter: starting the change now"
        ),
        Resumed::Unreadable(error) => {
            eprintln!("drill: cannot read standard input ({error}): starting the change now")
        }
    }
    resumed
}

fn read_one_line(mut input: impl BufRead) -> Resumed {
    let mut line = String::new();
    match input.read_line(&mut line) {
        Ok(0) => Resumed::Closed,
        Ok(_) => Resumed::Line,
        Err(error) => Resumed::Unreadable(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    #[tokio::test]
    async fn a_line_or_the_end_of_the_input_lets_the_drill_go_on() {
        assert!(matches!(
            for_enter(|| Cursor::new("\n")).await,
            Resumed::Line
        ));
        assert!(matches!(
            for_enter(|| Cursor::new("go\nmore\n")).await,
            Resumed::Line
        ));
        assert!(matches!(
            for_enter(|| Cursor::new("")).await,
            Resumed::Closed
        ));
        // A last line without its newline is still a line.
        assert!(matches!(
            for_enter(|| Cursor::new("go")).await,
            Resumed::Line
        ));
    }

    #[tokio::test]
    async fn an_unreadable_input_lets_the_drill_go_on() {
        struct Broken;
        impl std::io::Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
                Err(std::io::Error::other("no terminal"))
            }
        }
        let input = || std::io::BufReader::new(Broken);
        assert!(matches!(for_enter(input).await, Resumed::Unreadable(_)));
    }
}
