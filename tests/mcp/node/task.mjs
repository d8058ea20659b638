// A held call as an MCP task (protocol 2025-11-25), with the official TypeScript SDK client
// (v2) and its tasks extension (@modelcontextprotocol/ext-tasks). Prints {"taskCreated": task}
// as soon as the task exists (the pytest decides the approval then), and
// {"events": [...], "outcome": ...} once the task has settled.
// Usage: node task.mjs <base url> <api key> <tool id>
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";
import {
  createTaskSessionEndpointId,
  createTaskSessionFromClient,
} from "@modelcontextprotocol/ext-tasks/client";

const [base, key, toolId] = process.argv.slice(2);
const url = new URL("/mcp/", base);
const client = new Client({ name: "toolhub-node-task-test", version: "1.0.0" });
await client.connect(
  new StreamableHTTPClientTransport(url, {
    requestInit: { headers: { Authorization: `Bearer ${key}` } },
  }),
);
await client.listTools();

const session = createTaskSessionFromClient(client, {
  endpointId: await createTaskSessionEndpointId("toolhub-test", { url: url.href }),
});
const execution = await session.callTool(toolId, {}, {
  task: { preference: "require", retentionMs: 600000 },
  requestTimeoutMs: 120000,
});
const events = [];
let announced = false;
const { outcome } = await execution.settle({
  onEvent: (event) => {
    if (event.type === "task") {
      events.push(event.task.raw);
      if (!announced) {
        announced = true;
        process.stdout.write(JSON.stringify({ taskCreated: event.task.raw }) + "\n");
      }
    }
  },
});
const settled =
  outcome.status === "completed"
    ? { status: "completed", result: outcome.result }
    : { status: outcome.status, error: String(outcome.error?.message ?? "") };
await session.close();
await client.close();
process.stdout.write(JSON.stringify({ kind: execution.kind, events, outcome: settled }) + "\n");
