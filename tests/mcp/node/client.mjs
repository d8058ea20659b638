// toolhub's /mcp/ driven by the official TypeScript SDK client (v2, @modelcontextprotocol/client);
// prints one JSON object. Usage: node client.mjs <base url> <api key> <legacy|auto> ; the
// pytest in ../test_server_node.py asserts on it. "legacy" (the SDK's default) opens a
// session with initialize; "auto" probes server/discover and speaks 2026-07-28 when offered.
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const [base, key, negotiation] = process.argv.slice(2);
const options = negotiation === "auto" ? { versionNegotiation: { mode: "auto" } } : {};
const url = new URL("/mcp/", base);

// The client's own fetch, wrapped to see what the server answered a refused connect and
// how many tools/list pages the client asked for.
const answers = [];
let listRequests = 0;
async function watched(input, init) {
  if (typeof init?.body === "string" && JSON.parse(init.body).method === "tools/list") {
    listRequests += 1;
  }
  const response = await fetch(input, init);
  answers.push({ status: response.status, wwwAuthenticate: response.headers.get("www-authenticate") });
  return response;
}

function transport(headers) {
  return new StreamableHTTPClientTransport(url, { requestInit: { headers }, fetch: watched });
}

async function connected() {
  const client = new Client({ name: "toolhub-node-test", version: "1.0.0" }, options);
  const opened = transport({ Authorization: `Bearer ${key}` });
  await client.connect(opened);
  return { client, opened };
}

async function refusal(headers) {
  const client = new Client({ name: "toolhub-node-test", version: "1.0.0" }, options);
  answers.length = 0;
  try {
    await client.connect(transport(headers));
    await client.close();
    return { connected: true };
  } catch (error) {
    const answer = answers.at(-1) ?? {};
    return {
      connected: false,
      error: error?.constructor?.name ?? null,
      status: error?.status ?? answer.status ?? null,
      wwwAuthenticate: answer.wwwAuthenticate ?? null,
      message: String(error?.message ?? error),
    };
  }
}

async function rpcError(call) {
  try {
    return { result: await call() };
  } catch (error) {
    return { error: error?.constructor?.name, code: error?.code, message: String(error?.message) };
  }
}

const out = {};
const { client, opened } = await connected();
out.serverInfo = client.getServerVersion();
out.capabilities = client.getServerCapabilities();
out.protocolVersion = client.getNegotiatedProtocolVersion?.() ?? opened.protocolVersion ?? null;
// ping is not part of 2026-07-28.
if (negotiation !== "auto") await client.ping();

// Without a cursor, v2's listTools walks every page itself.
const listed = await client.listTools();
out.tools = listed.tools;
out.nextCursor = listed.nextCursor ?? null;
out.pages = listRequests;

out.time = await client.callTool({ name: "core__get_current_time", arguments: { timezone: "UTC" } });
out.call = await client.callTool({ name: "test__echo", arguments: { text: "from node" } });
out.held = await client.callTool({ name: "test__confirm", arguments: {} });
out.denied = await client.callTool({ name: "test__sleep", arguments: { ms: 1 } });
out.badArguments = await client.callTool({ name: "test__echo", arguments: { text: 42 } });
out.unknown = await rpcError(() => client.callTool({ name: "nope__missing", arguments: {} }));
out.namedRun = await client.callTool({
  name: "test__echo",
  arguments: { text: "in a named run" },
  _meta: { runId: "run_from_node" },
});
await client.close();

out.noKey = await refusal({});
out.badKey = await refusal({ Authorization: "Bearer th_wrong_key" });

process.stdout.write(JSON.stringify(out));
