// The OpenID Provider localui's tests sign in at: panva's oidc-provider (a certified
// implementation, pinned in package-lock.json), served on loopback with one client,
// the accounts a test names and the signing keys it hands over. tests/oidc_provider.py
// starts it; run it by hand with
//
//   npm ci --prefix tests/oidc
//   node tests/oidc/provider.mjs '{"port": 9000, "issuer": "http://127.0.0.1:9000", ...}'
//
// Its one argument is a JSON object:
//
//   port           the loopback port to listen on
//   issuer         the issuer URL tokens and discovery name, e.g. http://127.0.0.1:9000
//   client         {client_id, client_secret, redirect_uris: [...]}: a confidential
//                  client that authenticates with client_secret_basic and uses the
//                  authorization-code flow, with PKCE (S256) required
//   keys           the signing keys, private RS256 JWKs each with a "kid"; the first signs
//   accounts       {login: {name, preferred_username, email, groups: [...]}}: who may
//                  sign in (any password is accepted, an unknown login is not)
//   id_token_ttl   seconds an ID token is good for (3600 when left out)
//   parent_pid     when given, the provider stops once that process is gone
//
// A sign-in is: the authorization request, this provider's login form at
// /interaction/<uid>, the form's POST, then redirects that end at the client's
// redirect_uri with ?code=…&state=…. Consent is not asked: the client is first-party,
// so whatever scopes and claims it asks for are granted. The ID token itself carries
// name, preferred_username, email and groups (for the scopes asked), as localui reads
// them from there. Codes are single-use. It prints "listening on http://127.0.0.1:<port>"
// when ready, and logs each request and each refused one to stdout.

import { createServer } from 'node:http';
import { randomBytes } from 'node:crypto';

import Provider from 'oidc-provider';

const config = JSON.parse(process.argv[2] ?? '');
const accounts = config.accounts ?? {};
const idTokenTtl = config.id_token_ttl ?? 3600;

function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

function loginPage({ uid, login = '', refusal = '' }) {
  const said = refusal ? `<p role="alert" class="refusal">${escapeHtml(refusal)}</p>` : '';
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in</title></head>
<body>
<h1>Sign in</h1>
${said}
<form method="post" action="/interaction/${escapeHtml(uid)}/login" autocomplete="off">
  <label>Login <input name="login" value="${escapeHtml(login)}" required autofocus></label>
  <label>Password <input name="password" type="password"></label>
  <button type="submit">Sign in</button>
</form>
</body></html>
`;
}

const provider = new Provider(config.issuer, {
  clients: [{
    client_id: config.client.client_id,
    client_secret: config.client.client_secret,
    redirect_uris: config.client.redirect_uris,
    token_endpoint_auth_method: 'client_secret_basic',
    grant_types: ['authorization_code'],
    response_types: ['code'],
    id_token_signed_response_alg: 'RS256',
  }],
  jwks: { keys: config.keys },
  // A fresh secret each start: a restart signs a person out of the provider, as a
  // provider that lost its sessions would.
  cookies: { keys: [randomBytes(32).toString('base64url')] },
  scopes: ['openid'],
  claims: {
    openid: ['sub'],
    profile: ['name', 'preferred_username'],
    email: ['email'],
    groups: ['groups'],
  },
  // What the scopes asked for goes into the ID token itself, not only the userinfo
  // endpoint: localui signs a person in from the ID token alone.
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: false },
  },
  ttl: {
    IdToken: idTokenTtl,
    AccessToken: 3600,
    AuthorizationCode: 60,
    Grant: 14 * 86400,
    // A day, not an hour: the interaction's cookies expire by the provider's clock,
    // and a browser drops them at once when that clock runs hours slow (faketime).
    Interaction: 86400,
    Session: 14 * 86400,
  },
  interactions: {
    url: (_ctx, interaction) => `/interaction/${interaction.uid}`,
  },
  async findAccount(_ctx, sub) {
    const account = accounts[sub];
    if (!account) return undefined;
    return { accountId: sub, claims: async () => ({ sub, ...account }) };
  },
  // The one client is localui's own: it is granted every scope and claim it asks for,
  // so no consent page stands between the login form and the redirect back.
  async loadExistingGrant(ctx) {
    const { oidc } = ctx;
    const { accountId } = oidc.account;
    const grantId = oidc.result?.consent?.grantId || oidc.session.grantIdFor(oidc.client.clientId);
    const found = grantId ? await oidc.provider.Grant.find(grantId) : undefined;
    // Another person signing in on the same browser gets a grant of their own.
    const grant = found?.accountId === accountId
      ? found
      : new oidc.provider.Grant({ clientId: oidc.client.clientId, accountId });
    grant.addOIDCScope([...oidc.requestParamScopes].join(' '));
    grant.addOIDCClaims([...oidc.requestParamClaims]);
    await grant.save();
    return grant;
  },
});

for (const event of ['authorization.error', 'grant.error', 'server_error', 'jwks.error',
  'discovery.error', 'end_session.error', 'userinfo.error']) {
  provider.on(event, (_ctx, error) => {
    console.log(`${event}: ${error.name} ${error.message}${error.error_description ? ` (${error.error_description})` : ''}`);
  });
}

async function readForm(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

function send(res, status, html) {
  res.writeHead(status, { 'content-type': 'text/html; charset=utf-8', 'cache-control': 'no-store' });
  res.end(html);
}

// The login form: GET shows it, POST checks the login and hands the account back to
// oidc-provider, which redirects on to the client.
async function interaction(req, res, uid, action) {
  let details;
  try {
    details = await provider.interactionDetails(req, res);
  } catch (error) {
    send(res, 400, `<!doctype html><p>This sign-in has expired or is unknown: ${escapeHtml(error.message)}</p>`);
    return;
  }
  if (details.uid !== uid || details.prompt.name !== 'login') {
    send(res, 400, `<!doctype html><p>Nothing to do here for prompt ${escapeHtml(details.prompt.name)}.</p>`);
    return;
  }
  if (req.method === 'GET' && action === '') {
    send(res, 200, loginPage({ uid, login: details.params.login_hint ?? '' }));
    return;
  }
  if (req.method === 'POST' && action === '/login') {
    const form = await readForm(req);
    const login = form.get('login') ?? '';
    if (!Object.hasOwn(accounts, login)) {
      console.log(`login refused: no account ${JSON.stringify(login)}`);
      send(res, 400, loginPage({ uid, login, refusal: `No account has the login "${login}".` }));
      return;
    }
    await provider.interactionFinished(req, res, { login: { accountId: login } }, {
      mergeWithLastSubmission: false,
    });
    return;
  }
  send(res, 405, '<!doctype html><p>Method not allowed.</p>');
}

const providerCallback = provider.callback();
const interactionPath = /^\/interaction\/([A-Za-z0-9_-]+)(\/login)?$/;

const server = createServer((req, res) => {
  res.on('finish', () => console.log(`${req.method} ${req.url} ${res.statusCode}`));
  const match = interactionPath.exec(new URL(req.url, config.issuer).pathname);
  if (!match) {
    providerCallback(req, res);
    return;
  }
  interaction(req, res, match[1], match[2] ?? '').catch((error) => {
    console.log(`interaction failed: ${error.stack}`);
    if (!res.headersSent) send(res, 500, '<!doctype html><p>The sign-in failed.</p>');
  });
});

function stop() {
  server.close(() => process.exit(0));
  server.closeAllConnections();
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
// Gone with the test run that started it, even one killed outright: no provider is
// left behind holding its port.
if (config.parent_pid) {
  setInterval(() => {
    try {
      process.kill(config.parent_pid, 0);
    } catch {
      console.log(`process ${config.parent_pid} is gone: stopping`);
      stop();
    }
  }, 1000).unref();
}

server.listen(config.port, '127.0.0.1', () => {
  console.log(`listening on http://127.0.0.1:${config.port}`);
});
