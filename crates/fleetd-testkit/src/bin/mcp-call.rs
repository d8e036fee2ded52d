//! `mcp-call TOOL ARGS_FILE OUT_FILE`: one MCP tool call to fleetd at `$FLEETD_URL`, made from
//! whatever pane this runs in (so fleetd identifies the caller by that pane). Writes
//! `{"result": ...}` or `{"error": "..."}` to OUT_FILE atomically (a temp file renamed), so a
//! test can wait for the file. A test double; never used by the daemon.

use anyhow::Context as _;
use fleetd_testkit::sim_agent::mcp::McpClient;
use serde_json::{Value, json};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [tool, args_file, out_file] = args.as_slice() else {
        anyhow::bail!("usage: mcp-call TOOL ARGS_FILE OUT_FILE (FLEETD_URL names fleetd)");
    };
    let url = std::env::var("FLEETD_URL").context("FLEETD_URL is not set")?;
    let arguments: Value = serde_json::from_str(
        &std::fs::read_to_string(args_file).with_context(|| format!("reading {args_file}"))?,
    )
    .context("ARGS_FILE is not JSON")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(async {
        let mut client = McpClient::new(&url)?;
        client.initialize().await?;
        client.call_tool(tool, arguments).await
    });
    let body = match outcome {
        Ok(result) => json!({ "result": result }),
        Err(e) => json!({ "error": format!("{e:#}") }),
    };
    let tmp = format!("{out_file}.tmp");
    std::fs::write(&tmp, serde_json::to_vec(&body)?)?;
    std::fs::rename(&tmp, out_file)?;
    Ok(())
}
