// toolhub's /mcp/ driven by the official TypeScript SDK client; prints one JSON object.
// Usage: node client.mjs <base url> <api key> ; the pytest in ../test_server_node.py asserts on it.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [base, key] = process.argv.slice(2);
const url = new URL("/mcp/", base);

function transport(headers) {
  return new StreamableHTTPClientTransport(url, { requestInit: { headers } });
}

async function connected() {
  const client = new Client({ name: "toolhub-node-test", version: "1.0.0" });
  await client.connect(transport({ Authorization: `Bearer ${key}` }));
  return client;
}

async function refusal(headers) {
  const client = new Client({ name: "toolhub-node-test", version: "1.0.0" });
  try {
    await client.connect(transport(headers));
    await client.close();
    return { connected: true };
  } catch (error) {
    return { connected: false, status: error?.code ?? null, message: String(error?.message ?? error) };
  }
}

const out = {};
const client = await connected();
out.serverInfo = client.getServerVersion();
out.capabilities = client.getServerCapabilities();
out.protocolVersion = client.transport?.protocolVersion ?? null;
await client.ping();

const tools = [];
let pages = 0;
let cursor;
do {
  const page = await client.listTools(cursor ? { cursor } : undefined);
  tools.push(...page.tools);
  pages += 1;
  cursor = page.nextCursor;
} while (cursor);
out.tools = tools;
out.pages = pages;

out.call = await client.callTool({ name: "test__echo", arguments: { text: "from node" } });
out.held = await client.callTool({ name: "test__confirm", arguments: {} });
out.denied = await client.callTool({ name: "test__sleep", arguments: { ms: 1 } });
out.badArguments = await client.callTool({ name: "test__echo", arguments: { text: 42 } });
out.namedRun = await client.callTool({
  name: "test__echo",
  arguments: { text: "in a named run" },
  _meta: { runId: "run_from_node" },
});
await client.close();

out.noKey = await refusal({});
out.badKey = await refusal({ Authorization: "Bearer th_wrong_key" });

process.stdout.write(JSON.stringify(out));
