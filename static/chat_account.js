// The chat page's account corner (accounts on): the "Sign out" button of the sidebar.
import { bindSignOut } from "./account_api.js";

bindSignOut(document.getElementById("sign-out"));
