//! Writes the Rust code of meshca's `.proto` files, or checks that the code checked in is what they make.
//!
//! meshca's protocol types are generated from their `.proto` files by prost-build, with protox as the
//! protobuf compiler (pure Rust: building meshca needs no `protoc`). The output is checked in, so an
//! ordinary build compiles neither; `scripts/protos` runs this tool after a `.proto` file changes, and
//! `.ci/run` runs it with `--check`, failing when the checked-in code is not what the files make.
//!
//! Usage: `meshca-protogen [--check] REPO_ROOT`

use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// One generated file: the `.proto` files it comes from (relative to `include`), and where it goes.
struct Generated {
    include: &'static str,
    protos: &'static [&'static str],
    /// The protobuf package, whose file prost-build writes (`<package>.rs`; `_` for none).
    package: &'static str,
    /// Protobuf packages another crate already has Rust for: (protobuf path, Rust path).
    extern_paths: &'static [(&'static str, &'static str)],
    out: &'static str,
}

const GENERATED: &[Generated] = &[
    Generated {
        include: "agent-server/proto",
        protos: &["meshca/agent/v1/agent.proto"],
        package: "meshca.agent.v1",
        extern_paths: &[],
        out: "agent-server/src/proto/meshca.agent.v1.rs",
    },
    Generated {
        include: "workload/proto",
        protos: &["workload.proto"],
        package: "_",
        // `google.protobuf.Struct` (a validated token's claims): Envoy's types already carry it.
        extern_paths: &[(
            ".google.protobuf.Struct",
            "::envoy_types::pb::google::protobuf::Struct",
        )],
        out: "workload/src/proto/workload.rs",
    },
];

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let check = match args.iter().position(|a| a == "--check") {
        Some(at) => {
            args.remove(at);
            true
        }
        None => false,
    };
    let [root] = args.as_slice() else {
        eprintln!("usage: meshca-protogen [--check] REPO_ROOT");
        return ExitCode::from(2);
    };
    let root = PathBuf::from(root);
    let mut stale = Vec::new();
    for generated in GENERATED {
        let code = match generate(&root, generated) {
            Ok(code) => code,
            Err(error) => {
                eprintln!("{}: {error}", generated.out);
                return ExitCode::FAILURE;
            }
        };
        let out = root.join(generated.out);
        let current = std::fs::read_to_string(&out).unwrap_or_default();
        if current == code {
            continue;
        }
        if check {
            stale.push(generated.out);
        } else if let Err(error) = std::fs::write(&out, code) {
            eprintln!("{}: cannot write: {error}", out.display());
            return ExitCode::FAILURE;
        } else {
            println!("wrote {}", generated.out);
        }
    }
    if !stale.is_empty() {
        eprintln!(
            "not what the .proto files make (run scripts/protos and commit the result): {}",
            stale.join(", ")
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The Rust prost-build makes of one set of `.proto` files, with a header naming its source.
fn generate(root: &Path, generated: &Generated) -> Result<String, String> {
    let include = root.join(generated.include);
    let protos: Vec<PathBuf> = generated.protos.iter().map(|p| include.join(p)).collect();
    let descriptors = protox::compile(&protos, [&include]).map_err(|e| e.to_string())?;
    let out_dir = std::env::temp_dir().join(format!("meshca-protogen-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    let mut config = prost_build::Config::new();
    config.out_dir(&out_dir);
    for (proto, rust) in generated.extern_paths {
        config.extern_path(*proto, *rust);
    }
    let written = config
        .compile_fds(descriptors)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            std::fs::read_to_string(out_dir.join(format!("{}.rs", generated.package)))
                .map_err(|e| e.to_string())
        });
    let _ = std::fs::remove_dir_all(&out_dir);
    let sources = generated
        .protos
        .iter()
        .map(|p| format!("{}/{p}", generated.include))
        .collect::<Vec<_>>()
        .join(", ");
    Ok(format!(
        "// @generated from {sources} by tools/protogen (scripts/protos). Do not edit: edit the .proto file\n// and run scripts/protos.\n{}",
        written?
    ))
}
