//! Running a program to completion and reporting its failure.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::thread;

/// Runs `command` with `input` on its standard input and captures its output.
///
/// Panics only when the program cannot be started; a failing exit status is the caller's to judge.
pub(crate) fn output(command: &mut Command, input: &[u8]) -> Output {
    let stdin = if input.is_empty() {
        Stdio::null()
    } else {
        Stdio::piped()
    };
    let mut child = command
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting `{}`: {e}", describe(command)));
    // A separate writer: a program that answers while it reads could otherwise fill its output pipe and
    // wait for us while we wait for it.
    let stdin = child.stdin.take();
    let result = thread::scope(|scope| {
        if let Some(mut stdin) = stdin {
            // A program that exits early closes the pipe; its exit status tells what went wrong.
            scope.spawn(move || stdin.write_all(input));
        }
        child.wait_with_output()
    });
    result.unwrap_or_else(|e| panic!("waiting for `{}`: {e}", describe(command)))
}

/// Like [`output`], but panics, naming the command and quoting its stderr, unless it exits with 0.
pub(crate) fn run(command: &mut Command, input: &[u8]) -> Output {
    let output = output(command, input);
    if !output.status.success() {
        panic!("{}", failure(command, &output));
    }
    output
}

/// What to say about a command that failed: the command line, its exit status and its stderr.
pub(crate) fn failure(command: &Command, output: &Output) -> String {
    format!(
        "`{}` failed ({}): {}",
        describe(command),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim_end()
    )
}

/// The command line, for messages.
fn describe(command: &Command) -> String {
    let mut line = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}
