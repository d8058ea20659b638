// A real OpenID provider for toolhub's tests: panva's oidc-provider (certified by the
// OpenID Foundation), with a small password login of its own in front of it.
//
//   node provider.mjs PORT STATE.json
//
// STATE.json is read again at every lookup, so a test changes users and clients by
// rewriting it (tests/identity/provider.py does):
//   {"clients": [{client_id, client_secret?, redirect_uris, grant_types, ...}],
//    "users": {"alice": {"password": "...", "claims": {"groups": [...], "email": ...},
//                        "token_claims": {...}}},
//    "resources": {"https://...": {"scope": "mcp", "ttl": 300}},
//    "claims": {"groups": ["groups"]}}   (read once at start: scope -> claim names)
//
// Enabled: discovery, authorization code (+ PKCE), refresh, client credentials,
// resource indicators (RFC 8707) with JWT access tokens whose aud is the resource,
// RFC 9207 `iss` in authorization responses, RP-initiated logout, revocation,
// introspection. Users sign in through the form at /interaction/:uid; consent is
// given at once (a first-party provider).
import { readFileSync } from 'node:fs';
import http from 'node:http';
import { randomBytes } from 'node:crypto';

import { exportJWK, generateKeyPair } from 'jose';
import Provider, { errors } from 'oidc-provider';
import { createMemoryAdapter } from 'oidc-provider/lib/adapters/memory_adapter.js';

const [port, statePath] = process.argv.slice(2);
if (!port || !statePath) {
  console.error('usage: node provider.mjs PORT STATE.json');
  process.exit(2);
}
const issuer = `http://127.0.0.1:${port}`;

function state() {
  return JSON.parse(readFileSync(statePath, 'utf8'));
}

const memory = createMemoryAdapter();

// Clients come from the state file, so a test registers the redirect URI of the toolhub
// it just started.
class FileClients {
  async find(id) {
    const client = (state().clients ?? []).find((c) => c.client_id === id);
    return client ? { ...client } : undefined;
  }
  async upsert() {}
  async destroy() {}
  async consume() {}
  async findByUid() {}
  async findByUserCode() {}
  async revokeByGrantId() {}
}

const { privateKey } = await generateKeyPair('RS256', { extractable: true });
const signing = { ...(await exportJWK(privateKey)), kid: randomBytes(8).toString('hex'), alg: 'RS256', use: 'sig' };

const claims = {
  openid: ['sub'],
  profile: ['name', 'preferred_username'],
  email: ['email', 'email_verified'],
  groups: ['groups'],
  ...(state().claims ?? {}),
};

function user(login) {
  return (state().users ?? {})[login];
}

const provider = new Provider(issuer, {
  adapter: (model) => (model === 'Client' ? new FileClients() : memory(model)),
  jwks: { keys: [signing] },
  cookies: { keys: [randomBytes(32).toString('hex')] },
  claims,
  // The claims a scope grants go into the ID token too, not only to userinfo.
  conformIdTokenClaims: false,
  clientDefaults: {
    grant_types: ['authorization_code', 'refresh_token'],
    response_types: ['code'],
    token_endpoint_auth_method: 'client_secret_basic',
    id_token_signed_response_alg: 'RS256',
  },
  scopes: ['openid', 'offline_access', 'profile', 'email', 'groups'],
  ttl: {
    IdToken: () => Number(state().id_token_ttl ?? 3600),
    Session: 3600,
    Interaction: 600,
    Grant: 3600,
    AuthorizationCode: 60,
    RefreshToken: 3600,
    AccessToken: (ctx, token) => token.resourceServer?.accessTokenTTL ?? 3600,
    ClientCredentials: (ctx, token) => token.resourceServer?.accessTokenTTL ?? 600,
  },
  async findAccount(ctx, sub) {
    const record = user(sub);
    if (!record) return undefined;
    return {
      accountId: sub,
      async claims() {
        // Read again: a test that changes a user's groups sees the change at the next
        // sign-in, as with a real directory.
        const now = user(sub) ?? record;
        return { sub, preferred_username: sub, ...(now.claims ?? {}) };
      },
    };
  },
  async extraTokenClaims(ctx, token) {
    // Claims a resource server maps to a principal and tenant (token_claims of the user,
    // or of the client for client credentials).
    if (token.accountId) return user(token.accountId)?.token_claims;
    const client = (state().clients ?? []).find((c) => c.client_id === token.clientId);
    return client?.token_claims;
  },
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    introspection: { enabled: true },
    revocation: { enabled: true },
    rpInitiatedLogout: {
      enabled: true,
      // Plain pages (the default one imports a web font: nothing to fetch in a test).
      async logoutSource(ctx, form) {
        ctx.body = `<!doctype html><html><head><title>Sign out</title></head><body>
<h1>Sign out of the test provider?</h1>${form}
<button autofocus type="submit" form="op.logoutForm" value="yes" name="logout">Yes, sign me out</button>
<button type="submit" form="op.logoutForm">No, stay signed in</button></body></html>`;
      },
      async postLogoutSuccessSource(ctx) {
        ctx.body = '<!doctype html><title>Signed out</title><h1>Signed out of the test provider</h1>';
      },
    },
    resourceIndicators: {
      enabled: true,
      defaultResource: async (ctx, client, oneOf) => oneOf,
      useGrantedResource: async () => true,
      async getResourceServerInfo(ctx, resource) {
        const known = (state().resources ?? {})[resource];
        if (!known) throw new errors.InvalidTarget(`unknown resource ${resource}`);
        return {
          scope: known.scope ?? 'mcp',
          audience: resource,
          accessTokenTTL: Number(known.ttl ?? 300),
          accessTokenFormat: 'jwt',
          jwt: { sign: { alg: 'RS256' } },
        };
      },
    },
  },
  pkce: { required: () => false },
  interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
  renderError(ctx, out) {
    ctx.type = 'html';
    ctx.body = `<!doctype html><title>Error</title><h1>${escape(out.error)}</h1><p>${escape(out.error_description ?? '')}</p>`;
  },
});
provider.proxy = false;

function escape(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function loginPage(uid, clientId, message) {
  return `<!doctype html><html><head><title>Sign in to the test provider</title></head><body>
<h1>Sign in to the test provider</h1>
<p>for ${escape(clientId)}</p>
${message ? `<p role="alert">${escape(message)}</p>` : ''}
<form method="post" action="/interaction/${escape(uid)}/login">
<label>Username <input name="login" autocomplete="username" autofocus></label>
<label>Password <input name="password" type="password" autocomplete="current-password"></label>
<button type="submit">Sign in</button>
</form></body></html>`;
}

async function formBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

async function consent(details) {
  const { prompt, params, session } = details;
  const grant = details.grantId
    ? await provider.Grant.find(details.grantId)
    : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
  const missing = prompt.details;
  if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
  if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
  for (const [resource, scopes] of Object.entries(missing.missingResourceScopes ?? {})) {
    grant.addResourceScope(resource, scopes.join(' '));
  }
  return { consent: { grantId: await grant.save() } };
}

async function interaction(req, res, path) {
  const details = await provider.interactionDetails(req, res);
  const { uid, prompt, params } = details;
  if (req.method === 'POST' && path.endsWith('/login')) {
    const form = await formBody(req);
    const login = form.get('login') ?? '';
    const record = user(login);
    if (!record || record.password !== form.get('password')) {
      res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
      res.end(loginPage(uid, params.client_id, 'Wrong username or password.'));
      return;
    }
    await provider.interactionFinished(req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false });
    return;
  }
  if (prompt.name === 'login') {
    res.writeHead(200, { 'content-type': 'text/html; charset=utf-8' });
    res.end(loginPage(uid, params.client_id, ''));
    return;
  }
  if (prompt.name === 'consent') {
    await provider.interactionFinished(req, res, await consent(details), { mergeWithLastSubmission: true });
    return;
  }
  res.writeHead(400, { 'content-type': 'text/plain' });
  res.end(`unexpected prompt ${prompt.name}`);
}

const callback = provider.callback();
const server = http.createServer((req, res) => {
  const path = new URL(req.url, issuer).pathname;
  if (path.startsWith('/interaction/')) {
    interaction(req, res, path).catch((err) => {
      res.writeHead(400, { 'content-type': 'text/plain' });
      res.end(`interaction failed: ${err.message}`);
    });
    return;
  }
  callback(req, res);
});
server.listen(Number(port), '127.0.0.1', () => {
  console.log(`oidc-provider listening on ${issuer}`);
});
for (const signal of ['SIGTERM', 'SIGINT']) {
  process.on(signal, () => server.close(() => process.exit(0)));
}
